// Split-K decode through the public API: plan once, forward; paged and contiguous identical;
// merge_states against the float64 reference. Skips without a GPU.
#include "runtime/driver.hpp"
#include "tests/gpu/gpu_test.hpp"
#include "tests/harness/device_case.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

namespace flashjit {
namespace {

class DecodeGpu : public GpuTest {};

struct DecodeCase {
  const char *name;
  int batch, q_len, kv_len, heads_q, heads_kv, d;
  int page_size;
  bool causal;
  int window_left;
  float softcap;
  ref::Dtype dtype;
  int row_padding = 0; // odd: rows not 16-byte aligned (the element-aligned copy path, .al2)
};

harness::CaseOptions to_options(const DecodeCase &c) {
  harness::CaseOptions o;
  o.problem = ref::Problem::dense(c.batch, c.q_len, c.kv_len, c.heads_q, c.heads_kv, c.d, c.d);
  o.problem.causal = c.causal;
  o.problem.window_left = c.window_left;
  o.problem.softcap = c.softcap;
  o.page_size = c.page_size;
  o.dtype = c.dtype;
  o.with_workspace = true;
  o.row_padding = c.row_padding;
  return o;
}

TEST_F(DecodeGpu, SplitKMatchesReference) {
  const DecodeCase cases[] = {
      // Short steps of d <= 128 with one m16 tile of query rows run the wide key block
      // (decode_key_block_for: 128-key tiles, one CTA per SM); 2 x 30000 x 8 KV heads is past its
      // reach and keeps the planner's 64-key tiles.
      {"long_split_gqa4", 1, 1, 20000, 32, 8, 128, 0, false, -1, 0, ref::Dtype::bf16},
      {"long_split_default_tiles", 2, 1, 30000, 32, 8, 128, 0, false, -1, 0, ref::Dtype::bf16},
      {"page16_gqa6", 3, 1, 1000, 12, 2, 128, 16, false, -1, 0, ref::Dtype::bf16},
      {"page1_gqa7", 2, 1, 333, 14, 2, 64, 1, false, -1, 0, ref::Dtype::fp16},
      {"q4_causal_page7", 2, 4, 513, 8, 1, 80, 7, true, -1, 0, ref::Dtype::bf16},
      {"window_softcap", 2, 2, 4097, 8, 8, 72, 0, true, 300, 30, ref::Dtype::fp16},
      {"kv_len_1", 4, 1, 1, 8, 2, 256, 16, false, -1, 0, ref::Dtype::bf16},
      {"d192v_q16", 1, 16, 2000, 8, 1, 192, 64, true, -1, 0, ref::Dtype::bf16},
      // CTA runs balanced by keys: 20011 x 4 heads over the grid cuts pieces mid-tile and mid-page.
      {"long_split_page48", 1, 1, 20011, 16, 4, 128, 48, false, -1, 0, ref::Dtype::bf16},
      {"long_split_q4_causal_page1", 1, 4, 9001, 8, 2, 64, 1, true, -1, 0, ref::Dtype::fp16},
      // Long enough (1601 tiles x 8 heads over 264 CTAs: 48.5 per run) for the runtime's default to
      // balance the runs by keys (SplitKShape::key_balance_min_run_tiles); the rows above take whole tiles.
      {"long_by_keys_page16", 1, 1, 102401, 32, 8, 128, 16, false, -1, 0, ref::Dtype::bf16},
      // Whole units (SplitKShape::whole_units_max_excess_pct): 528 equal units on the H200's 264 CTAs,
      // two per run and nothing split; 777 keys end mid-tile and mid-page.
      {"whole_units_page16", 66, 1, 777, 32, 8, 128, 16, false, -1, 0, ref::Dtype::bf16},
      {"whole_units_q4_causal_gqa7_page1", 66, 4, 301, 28, 4, 64, 1, true, -1, 0, ref::Dtype::fp16},
      // Element-aligned rows: each 16-byte chunk is loaded through registers.
      {"element_aligned_gqa4", 2, 1, 3001, 32, 8, 128, 0, false, -1, 0, ref::Dtype::bf16, 3},
      {"element_aligned_q4_causal_gqa7", 1, 4, 777, 14, 2, 64, 0, true, -1, 0, ref::Dtype::fp16, 5},
      // TMA tiles over contiguous KV with a window (pieces start at any key), q_len 4 causal with
      // GQA 7; paged with a window keeps cp.async tiles (its pieces start off the 16-key boxes).
      {"window_contiguous_gqa4", 2, 1, 6000, 32, 8, 128, 0, false, 1000, 0, ref::Dtype::bf16},
      {"q4_causal_gqa7_fp16", 3, 4, 2049, 28, 4, 128, 0, true, -1, 0, ref::Dtype::fp16},
      {"window_page16", 2, 1, 3000, 8, 2, 128, 16, false, 500, 0, ref::Dtype::bf16},
  };
  for (const DecodeCase &c : cases) {
    Options options;
    options.strict = 1; // the split-K kernel itself, no fallback
    Runtime runtime(options);
    harness::CaseOptions o = to_options(c);
    const harness::CaseResult r = harness::run_case(runtime, o);
    std::cout << c.name << ": " << r.summary() << "\n";
    EXPECT_TRUE(r.pass()) << c.name << ": " << r.summary();
    EXPECT_NE(r.kernel.find("decode.decode_splitk"), std::string::npos) << c.name << " ran " << r.kernel;
    if (c.row_padding % 2 != 0) {
      EXPECT_NE(r.kernel.find(".al2"), std::string::npos) << c.name << " ran " << r.kernel;
    }
    // sm_90: K/V tiles by TMA wherever the plan allows them (compiler/plans/decode_plan.cpp).
    constexpr int kTmaPanel = 64, kTmaPagedBox = 16;
    const bool tma_allowed = c.d % kTmaPanel == 0 && c.row_padding % 2 == 0 &&
                             (c.page_size == 0 || (c.page_size % kTmaPagedBox == 0 && c.window_left < 0));
    if (r.kernel.find(".sm90a.") != std::string::npos) {
      EXPECT_EQ(r.kernel.find(".tma.") != std::string::npos, tma_allowed) << c.name << " ran " << r.kernel;
      // The wide key block where decode_key_block_for takes it: the key x KV-head count of the
      // problem's shape (the table's capacity when paged) at most 2^18.
      constexpr int64_t kWideMaxKeyHeads = int64_t(1) << 18;
      constexpr int kWideMaxDim = 128, kRowsOfOneTile = 16;
      const int64_t keys = c.page_size > 0 ? int64_t(c.kv_len + c.page_size - 1) / c.page_size * c.page_size : c.kv_len;
      const bool wide = tma_allowed && c.d <= kWideMaxDim && c.heads_q / c.heads_kv * c.q_len <= kRowsOfOneTile &&
                        int64_t(c.batch) * keys * c.heads_kv <= kWideMaxKeyHeads;
      EXPECT_EQ(r.kernel.find(".m16n128s") != std::string::npos, wide) << c.name << " ran " << r.kernel;
    }
  }
}

// Runs `c`, then `c` with `change` applied to its options: both pass the float64 check and give the
// same bits.
template <class Change> void expect_same_bits(const DecodeCase &c, Change change) {
  Runtime runtime;
  harness::CaseOptions o = to_options(c);
  const harness::CaseResult first = harness::run_case(runtime, o);
  change(o);
  const harness::CaseResult second = harness::run_case(runtime, o);
  ASSERT_TRUE(first.pass() && second.pass()) << first.summary() << "\n" << second.summary();
  EXPECT_EQ(first.o_values, second.o_values) << c.name;
}

TEST_F(DecodeGpu, PagedEqualsContiguousBitwise) {
  expect_same_bits(DecodeCase{"paged_vs_contiguous", 2, 1, 5000, 32, 8, 128, 0, false, -1, 0, ref::Dtype::bf16},
                   [](harness::CaseOptions &o) { o.page_size = 16; });
}

// The same values stored head-major ([B, Hkv, L, D], PyTorch's layout): the same kernel and schedule,
// so the same bits.
TEST_F(DecodeGpu, HeadMajorEqualsTokenMajorBitwise) {
  expect_same_bits(DecodeCase{"head_major", 2, 4, 5000, 32, 8, 128, 0, true, -1, 0, ref::Dtype::bf16},
                   [](harness::CaseOptions &o) { o.head_major = true; });
}

// Pages stored head-major ([pages, Hkv, page, D], FlashInfer's HND) against the usual NHD pages.
TEST_F(DecodeGpu, HeadMajorPagesEqualTokenMajorPagesBitwise) {
  expect_same_bits(DecodeCase{"head_major_pages", 3, 2, 1999, 24, 4, 128, 16, true, -1, 0, ref::Dtype::fp16},
                   [](harness::CaseOptions &o) { o.head_major = true; });
}

TEST_F(DecodeGpu, GraphReplayEqualsDirectLaunch) {
  expect_same_bits(DecodeCase{"graph", 4, 1, 9000, 32, 8, 128, 16, false, -1, 0, ref::Dtype::bf16},
                   [](harness::CaseOptions &o) { o.graph_capture = true; });
}

TEST_F(DecodeGpu, TooSmallWorkspaceIsAnErrorNotAnOverflow) {
  Runtime runtime;
  DecodeCase c{"small_ws", 2, 1, 3000, 8, 2, 128, 0, false, -1, 0, ref::Dtype::bf16};
  harness::CaseOptions o = to_options(c);
  o.workspace_shortfall = 256;
  const harness::CaseResult r = harness::run_case(runtime, o);
  EXPECT_EQ(r.status.code, FLASHJIT_INVALID_ARGUMENT) << r.summary();
  EXPECT_NE(r.status.message.find("workspace_bytes"), std::string::npos) << r.status.message;
}

TEST_F(DecodeGpu, MergeStatesMatchesFloat64) {
  constexpr int kStates = 5, kRows = 777, kDim = 72;
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  std::vector<float> o(size_t(kStates) * kRows * kDim), lse(size_t(kStates) * kRows);
  for (float &x : o)
    x = normal(rng);
  for (size_t i = 0; i < lse.size(); ++i)
    lse[i] = (i % 97 == 0) ? -INFINITY : 3 * normal(rng); // some states saw no key
  for (int s = 0; s < kStates; ++s)
    lse[size_t(s) * kRows + 5] = -INFINITY; // row 5 saw no key at all
  harness::DeviceBuffer d_o, d_lse, d_out, d_out_lse;
  ASSERT_TRUE(d_o.allocate(o.size() * 4) && d_o.upload(o.data(), o.size() * 4));
  ASSERT_TRUE(d_lse.allocate(lse.size() * 4) && d_lse.upload(lse.data(), lse.size() * 4));
  ASSERT_TRUE(d_out.allocate(size_t(kRows) * kDim * 2) && d_out.fill_bytes(0xFF));
  ASSERT_TRUE(d_out_lse.allocate(size_t(kRows) * 4) && d_out_lse.fill_bytes(0xFF));
  flashjit_merge_problem m;
  flashjit_merge_problem_init(&m);
  m.dtype = FLASHJIT_BF16;
  m.num_states = kStates;
  m.rows = kRows;
  m.head_dim_v = kDim;
  m.partial_o = static_cast<const float *>(d_o.get());
  m.partial_lse = static_cast<const float *>(d_lse.get());
  m.o = d_out.get();
  m.lse = static_cast<float *>(d_out_lse.get());
  Runtime runtime;
  Status s = runtime.merge_states(m);
  ASSERT_TRUE(s.ok()) << s.message;
  ASSERT_EQ(driver::api()->cuCtxSynchronize(), CUDA_SUCCESS);
  std::vector<uint16_t> out(size_t(kRows) * kDim);
  std::vector<float> out_lse(kRows);
  ASSERT_TRUE(d_out.download(out.data(), out.size() * 2));
  ASSERT_TRUE(d_out_lse.download(out_lse.data(), out_lse.size() * 4));
  std::vector<float> ours(out.size());
  std::vector<double> ref(out.size()), naive(out.size()), ref_lse(kRows), naive_lse(kRows);
  for (int r = 0; r < kRows; ++r) {
    double m_max = -INFINITY;
    for (int s2 = 0; s2 < kStates; ++s2)
      m_max = std::max<double>(m_max, lse[size_t(s2) * kRows + r]);
    double sum = 0;
    for (int s2 = 0; s2 < kStates; ++s2)
      if (std::isfinite(lse[size_t(s2) * kRows + r]))
        sum += std::exp(lse[size_t(s2) * kRows + r] - m_max);
    ref_lse[r] = naive_lse[r] = std::isfinite(m_max) ? m_max + std::log(sum) : -INFINITY;
    for (int c = 0; c < kDim; ++c) {
      double acc = 0;
      for (int s2 = 0; s2 < kStates; ++s2) {
        const double l = lse[size_t(s2) * kRows + r];
        if (std::isfinite(l))
          acc += std::exp(l - ref_lse[r]) * o[(size_t(s2) * kRows + r) * kDim + c];
      }
      ref[size_t(r) * kDim + c] = acc;
      naive[size_t(r) * kDim + c] = ref::round_to(ref::Dtype::bf16, static_cast<float>(acc));
      ours[size_t(r) * kDim + c] = ref::from_bits(ref::Dtype::bf16, out[size_t(r) * kDim + c]);
    }
  }
  const ref::CheckResult check = ref::check_output(ours, ref, naive);
  EXPECT_TRUE(check.pass) << check.summary;
  const ref::CheckResult check_lse = ref::check_lse(out_lse, ref_lse, naive_lse);
  EXPECT_TRUE(check_lse.pass) << check_lse.summary;
  for (int c = 0; c < kDim; ++c)
    EXPECT_EQ(ours[5 * kDim + c], 0.0f) << "a row with no key must be zero";
}

} // namespace
} // namespace flashjit
