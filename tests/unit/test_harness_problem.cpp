// The harness describes a case's problem without data (`flashjit explain` does): the strides must be
// those `run_case` uploads with, or explain names another kernel than check and bench run.
#include "tests/harness/device_case.hpp"

#include <gtest/gtest.h>

namespace flashjit {
namespace {

constexpr int kBatch = 2, kSeqQ = 300, kSeqK = 500, kHeadsQ = 8, kHeadsKv = 2, kDim = 128;

harness::CaseOptions case_options() {
  harness::CaseOptions o;
  o.problem.batch = kBatch;
  o.problem.seqlens_q = {kSeqQ, kSeqQ};
  o.problem.seqlens_k = {kSeqK, kSeqK};
  o.problem.heads_q = kHeadsQ;
  o.problem.heads_kv = kHeadsKv;
  o.problem.head_dim_qk = o.problem.head_dim_v = kDim;
  return o;
}

void expect_strides(const flashjit_strides &got, int64_t batch, int64_t token, int64_t head, const char *what) {
  EXPECT_EQ(got.batch, batch) << what;
  EXPECT_EQ(got.token, token) << what;
  EXPECT_EQ(got.head, head) << what;
}

TEST(HarnessProblem, RowPaddingStridesEveryTokenMajorOperand) {
  harness::CaseOptions o = case_options();
  o.row_padding = 4;
  AttentionProblem p;
  harness::describe_problem(o, &p);
  EXPECT_EQ(p.seqlen_q, kSeqQ);
  EXPECT_EQ(p.seqlen_k, kSeqK);
  const int64_t q_row = kHeadsQ * kDim + 4, kv_row = kHeadsKv * kDim + 4;
  expect_strides(p.q_strides, q_row * kSeqQ, q_row, kDim, "q");
  expect_strides(p.o_strides, q_row * kSeqQ, q_row, kDim, "o");
  expect_strides(p.k_strides, kv_row * kSeqK, kv_row, kDim, "k");
  expect_strides(p.v_strides, kv_row * kSeqK, kv_row, kDim, "v");
}

TEST(HarnessProblem, HeadMajorAndPagedLayouts) {
  harness::CaseOptions o = case_options();
  o.head_major = true;
  AttentionProblem p;
  harness::describe_problem(o, &p);
  expect_strides(p.q_strides, int64_t{kHeadsQ} * kSeqQ * kDim, kDim, int64_t{kSeqQ} * kDim, "q head-major");
  expect_strides(p.k_strides, int64_t{kHeadsKv} * kSeqK * kDim, kDim, int64_t{kSeqK} * kDim, "k head-major");

  o.page_size = 16; // pages [num_pages, heads, page, dim]
  harness::describe_problem(o, &p);
  expect_strides(p.k_strides, int64_t{kHeadsKv} * 16 * kDim, kDim, 16 * kDim, "k head-major pages");

  o.head_major = false;
  o.page_gap_bytes = size_t{1} << 31; // pages 2 GiB apart
  harness::describe_problem(o, &p);
  expect_strides(p.k_strides, int64_t{16} * kHeadsKv * kDim + (int64_t{1} << 30), kHeadsKv * kDim, kDim, "k gapped");

  o.page_gap_bytes = 0; // packed pages: the library's default strides
  o.varlen = true;
  harness::describe_problem(o, &p);
  expect_strides(p.k_strides, 0, 0, 0, "k packed pages");
  EXPECT_EQ(p.q_strides.batch, 0) << "varlen rows are packed";
}

// What explain concludes follows the strides: rows 4 elements (8 bytes) apart cannot be TMA's, so
// fa3 falls back to fa2 with the reason, as `flashjit check --row-padding 4` does.
TEST(HarnessProblem, ExplainSeesTheRowPadding) {
  harness::CaseOptions o = case_options();
  o.row_padding = 4;
  AttentionProblem p;
  harness::describe_problem(o, &p);
  constexpr uintptr_t kFakeDevicePointer = 0x7f0000000000ull; // 256-byte aligned, never dereferenced
  p.q = p.k = p.v = p.o = reinterpret_cast<void *>(kFakeDevicePointer);
  Runtime runtime;
  Explanation e;
  ASSERT_TRUE(runtime.explain(p, &e).ok());
  if (e.text.find("explained for sm90a") == std::string::npos)
    GTEST_SKIP() << "a driver is present (its GPU decides); covered by tests/gpu";
  EXPECT_EQ(e.variant, "fa2") << e.kernel;
  EXPECT_NE(e.kernel.find(".al2"), std::string::npos) << e.kernel;
  EXPECT_NE(e.fallback_reason.find("16-byte aligned rows"), std::string::npos) << e.fallback_reason;
  o.row_padding = 8; // 16 bytes: fa3 again
  harness::describe_problem(o, &p);
  ASSERT_TRUE(runtime.explain(p, &e).ok());
  EXPECT_EQ(e.variant, "fa3") << e.kernel;
}

} // namespace
} // namespace flashjit
