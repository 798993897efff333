// Tests of the float64 reference itself: every semantic rule is checked against an independent
// construction (a hand-computed case, a sub-problem with only the visible keys, expanded KV heads,
// per-sequence problems), so a wrong reference cannot pass by agreeing with itself.
#include "tests/reference/reference.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <set>

namespace flashjit::ref {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kExactTolerance = 1e-12; // two float64 evaluations of the same sums
constexpr uint32_t kF16Count = 1u << 16;

bool is_nan_bf16(uint16_t bits) {
  return (bits & 0x7F80u) == 0x7F80u && (bits & 0x007Fu) != 0;
}
bool is_nan_fp16(uint16_t bits) {
  return (bits & 0x7C00u) == 0x7C00u && (bits & 0x03FFu) != 0;
}

// ---------------------------------------------------------------------------------------------
// 16-bit rounding

TEST(Reference16Bit, Bf16KnownBitPatterns) {
  EXPECT_EQ(float_to_bf16(1.0f), 0x3F80);
  EXPECT_EQ(float_to_bf16(-2.0f), 0xC000);
  EXPECT_EQ(float_to_bf16(3.0f), 0x4040);
  EXPECT_EQ(float_to_bf16(0.0f), 0x0000);
  EXPECT_EQ(float_to_bf16(-0.0f), 0x8000);
  EXPECT_EQ(float_to_bf16(3.14159265f), 0x4049);
  EXPECT_EQ(float_to_bf16(std::numeric_limits<float>::infinity()), 0x7F80);
  EXPECT_EQ(float_to_bf16(-std::numeric_limits<float>::infinity()), 0xFF80);
  EXPECT_TRUE(is_nan_bf16(float_to_bf16(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_TRUE(is_nan_bf16(float_to_bf16(std::bit_cast<float>(0x7F800001u)))); // signaling NaN stays NaN
  EXPECT_EQ(float_to_bf16(std::numeric_limits<float>::max()), 0x7F80);        // rounds up to inf
  // Ties go to even: 1 + 2^-8 is halfway between 1 and 1 + 2^-7.
  EXPECT_EQ(float_to_bf16(1.0f + std::ldexp(1.0f, -8)), 0x3F80);
  EXPECT_EQ(float_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3F82);
  EXPECT_EQ(float_to_bf16(1.0f + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -20)), 0x3F81);
  EXPECT_EQ(float_to_bf16(std::bit_cast<float>(0x3F7FFFFFu)), 0x3F80); // just below 1 rounds up
  EXPECT_EQ(bf16_to_float(0x3F80), 1.0f);
  EXPECT_EQ(bf16_to_float(0x4049), 3.140625f);
  EXPECT_EQ(bf16_to_float(0x0001), std::ldexp(1.0f, -133)); // bf16 subnormal
  EXPECT_EQ(bf16_to_float(0xFF80), -std::numeric_limits<float>::infinity());
}

TEST(Reference16Bit, Fp16KnownBitPatterns) {
  EXPECT_EQ(float_to_fp16(1.0f), 0x3C00);
  EXPECT_EQ(float_to_fp16(-2.0f), 0xC000);
  EXPECT_EQ(float_to_fp16(0.1f), 0x2E66);
  EXPECT_EQ(float_to_fp16(1.0f / 3.0f), 0x3555);
  EXPECT_EQ(float_to_fp16(-0.0f), 0x8000);
  EXPECT_EQ(float_to_fp16(65504.0f), 0x7BFF);
  EXPECT_EQ(float_to_fp16(65519.0f), 0x7BFF);
  EXPECT_EQ(float_to_fp16(65520.0f), 0x7C00); // the tie above the largest finite value goes to inf
  EXPECT_EQ(float_to_fp16(1e6f), 0x7C00);
  EXPECT_EQ(float_to_fp16(-std::numeric_limits<float>::infinity()), 0xFC00);
  EXPECT_TRUE(is_nan_fp16(float_to_fp16(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_EQ(float_to_fp16(1.0f + std::ldexp(1.0f, -11)), 0x3C00);     // tie -> even
  EXPECT_EQ(float_to_fp16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3C02); // tie -> even
  // Subnormals, in units of 2^-24.
  EXPECT_EQ(float_to_fp16(std::ldexp(1.0f, -24)), 0x0001);
  EXPECT_EQ(float_to_fp16(std::ldexp(1.0f, -25)), 0x0000);    // half a unit: tie -> 0 (even)
  EXPECT_EQ(float_to_fp16(std::ldexp(3.0f, -26)), 0x0001);    // 0.75 units
  EXPECT_EQ(float_to_fp16(std::ldexp(3.0f, -25)), 0x0002);    // 1.5 units: tie -> 2
  EXPECT_EQ(float_to_fp16(-std::ldexp(5.0f, -25)), 0x8002);   // 2.5 units: tie -> 2
  EXPECT_EQ(float_to_fp16(std::ldexp(2047.0f, -25)), 0x0400); // 1023.5 units: carries into the smallest normal
  EXPECT_EQ(float_to_fp16(std::ldexp(1.0f, -14)), 0x0400);
  EXPECT_EQ(float_to_fp16(std::numeric_limits<float>::denorm_min()), 0x0000);
  EXPECT_EQ(fp16_to_float(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(fp16_to_float(0x03FF), std::ldexp(1023.0f, -24));
  EXPECT_EQ(fp16_to_float(0x8001), -std::ldexp(1.0f, -24));
  EXPECT_EQ(fp16_to_float(0x7BFF), 65504.0f);
  EXPECT_EQ(fp16_to_float(0x3555), 0.333251953125f);
  EXPECT_EQ(fp16_to_float(0x7C00), std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(fp16_to_float(0x7E00)));
}

TEST(Reference16Bit, EveryBitPatternRoundTrips) {
  for (Dtype dtype : {Dtype::fp16, Dtype::bf16})
    for (uint32_t bits = 0; bits < kF16Count; ++bits) {
      const float value = from_bits(dtype, uint16_t(bits));
      if (std::isnan(value)) {
        EXPECT_TRUE(std::isnan(from_bits(dtype, to_bits(dtype, value))));
        continue;
      }
      ASSERT_EQ(to_bits(dtype, value), bits) << dtype_name(dtype) << " value " << value;
    }
}

// Rounding of random floats against a brute-force search of the sorted representable values.
TEST(Reference16Bit, RoundsToNearestEven) {
  for (Dtype dtype : {Dtype::fp16, Dtype::bf16}) {
    std::vector<std::pair<float, uint16_t>> finite; // non-negative finite values, ascending with the bits
    for (uint32_t bits = 0; bits < kF16Count / 2; ++bits)
      if (std::isfinite(from_bits(dtype, uint16_t(bits))))
        finite.push_back({from_bits(dtype, uint16_t(bits)), uint16_t(bits)});
    const float largest = finite.back().first;
    const auto samples = random_tensor(4096, Dtype::bf16, 7, 1); // only used to pick exponents and mantissas
    for (size_t n = 0; n < samples.size(); ++n) {
      // A spread of magnitudes, including fp16 subnormals and near-overflow values.
      const float x = std::abs(samples[n]) * std::ldexp(1.0f, int(n % 40) - 26) + std::ldexp(float(n), -30);
      if (!(x < largest))
        continue;
      auto above = std::lower_bound(finite.begin(), finite.end(), x,
                                    [](const auto &entry, float value) { return entry.first < value; });
      uint16_t expected = above->second;
      if (above != finite.begin() && above->first != x) {
        const auto below = above - 1;
        const double gap_below = double(x) - below->first, gap_above = double(above->first) - x;
        if (gap_below < gap_above || (gap_below == gap_above && (below->second & 1u) == 0))
          expected = below->second;
      }
      ASSERT_EQ(to_bits(dtype, x), expected) << dtype_name(dtype) << " x=" << x;
      ASSERT_EQ(to_bits(dtype, -x), expected | 0x8000u) << dtype_name(dtype) << " x=" << -x;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Random inputs

TEST(ReferenceRandom, ValuesAreRepresentableSeededAndNonZero) {
  for (Dtype dtype : {Dtype::fp16, Dtype::bf16}) {
    const auto a = random_tensor(1001, dtype, 42), b = random_tensor(1001, dtype, 42);
    const auto c = random_tensor(1001, dtype, 43);
    EXPECT_EQ(a, b);
    EXPECT_NE(a, c);
    double sum_squares = 0;
    for (float x : a) {
      ASSERT_EQ(round_to(dtype, x), x);
      sum_squares += double(x) * x;
    }
    EXPECT_NEAR(std::sqrt(sum_squares / a.size()), 1.0, 0.1); // standard normal
    // A scale that underflows every value still yields a nonzero tensor.
    const auto tiny = random_tensor(8, dtype, 1, 1e-30f);
    EXPECT_TRUE(std::any_of(tiny.begin(), tiny.end(), [](float x) { return x != 0; })) << dtype_name(dtype);
  }
}

// Large tensors are filled chunk by chunk on every core: the values are those of one serial stream
// (every test's inputs stay what they were), across chunk boundaries (2^19 elements a chunk) and
// for an odd count; the values at these indices are the single-stream generator's of session 29.
TEST(ReferenceRandom, ParallelFillGivesTheSerialStream) {
  const size_t n = (size_t{1} << 20) + 7;
  const auto parallel = random_tensor(n, Dtype::bf16, 12345);
  const auto serial = random_tensor(n, Dtype::bf16, 12345, 1, /*parallel=*/false);
  EXPECT_EQ(parallel, serial);
  const std::pair<size_t, float> session29[] = {{0, 0.5625f},        {1, 1.9296875f},       {524287, -0.546875f},
                                                {524288, -2.15625f}, {524289, -1.1328125f}, {1048575, -1.09375f},
                                                {n - 1, 0.578125f}};
  for (const auto &[i, value] : session29)
    EXPECT_EQ(parallel[i], value) << i;
  const auto prefix = random_tensor(1001, Dtype::bf16, 12345);
  EXPECT_TRUE(std::equal(prefix.begin(), prefix.end(), parallel.begin())) << "a shorter tensor is the same stream";
}

// ---------------------------------------------------------------------------------------------
// Reference semantics

Problem single(int seqlen_q, int seqlen_k, int heads_q, int heads_kv, int dqk, int dv) {
  return Problem::dense(1, seqlen_q, seqlen_k, heads_q, heads_kv, dqk, dv);
}

TEST(ReferenceAttention, HandComputedTinyCase) {
  Problem problem = single(1, 2, 1, 1, 2, 2);
  problem.scale = 1;
  const std::vector<float> q{1, 0}, k{1, 0, 0, 1}, v{1, 2, 3, 4};
  const Output out = attention_f64(problem, q, k, v);
  const double e = std::exp(1.0);
  ASSERT_EQ(out.o.size(), 2u);
  EXPECT_NEAR(out.o[0], (e * 1 + 3) / (e + 1), kExactTolerance);
  EXPECT_NEAR(out.o[1], (e * 2 + 4) / (e + 1), kExactTolerance);
  EXPECT_NEAR(out.lse[0], std::log(e + 1), kExactTolerance);
}

TEST(ReferenceAttention, HandComputedCausalWithDefaultScale) {
  // sq = 2 < sk = 3, d = 4 so the default scale is exactly 1/2. Row 0 sees keys 0..1, row 1 all three.
  Problem problem = single(2, 3, 1, 1, 4, 1);
  problem.causal = true;
  const std::vector<float> q{1, 1, 0, 0, /**/ 0, 0, 1, 1};
  const std::vector<float> k{1, 0, 0, 0, /**/ 0, 0, 1, 0, /**/ 1, 1, 1, 1};
  const std::vector<float> v{2, 4, 8};
  const Output out = attention_f64(problem, q, k, v);
  // Row 0 logits: 0.5, 0 (key 2 hidden). Row 1 logits: 0, 0.5, 1.
  const double a = std::exp(0.5), b = std::exp(1.0);
  EXPECT_NEAR(out.o[0], (a * 2 + 4) / (a + 1), kExactTolerance);
  EXPECT_NEAR(out.lse[0], std::log(a + 1), kExactTolerance);
  EXPECT_NEAR(out.o[1], (2 + a * 4 + b * 8) / (1 + a + b), kExactTolerance);
  EXPECT_NEAR(out.lse[1], std::log(1 + a + b), kExactTolerance);
}

// Row (b, h, i) computed by a separate, unmasked problem over only the keys [keys.begin, keys.end).
struct Row {
  std::vector<double> o;
  double lse;
};
Row row_from_subproblem(const Problem &problem, const Inputs &in, int b, int h, int i, KeyInterval keys) {
  const int dqk = problem.head_dim_qk, dv = problem.head_dim_v;
  if (keys.empty())
    return {std::vector<double>(dv, 0.0), -kInf};
  const auto cu_q = problem.cu_seqlens_q(), cu_k = problem.cu_seqlens_k();
  const int hk = h / (problem.heads_q / problem.heads_kv);
  Problem sub = single(1, keys.size(), 1, 1, dqk, dv);
  sub.scale = problem.softmax_scale();
  sub.softcap = problem.softcap;
  const auto q_row = in.q.begin() + (size_t(cu_q[b] + i) * problem.heads_q + h) * dqk;
  std::vector<float> q(q_row, q_row + dqk), k, v;
  for (int j = keys.begin; j < keys.end; ++j) {
    const size_t row = size_t(cu_k[b] + j) * problem.heads_kv + hk;
    k.insert(k.end(), in.k.begin() + row * dqk, in.k.begin() + (row + 1) * dqk);
    v.insert(v.end(), in.v.begin() + row * dv, in.v.begin() + (row + 1) * dv);
  }
  const Output out = attention_f64(sub, q, k, v);
  return {out.o, out.lse[0]};
}

// Every row of `problem` against its sub-problem over the keys the spec says it sees.
void expect_rows_match_subproblems(const Problem &problem, uint64_t seed) {
  const Inputs in = random_inputs(problem, Dtype::bf16, seed);
  const Output out = attention_f64(problem, in.q, in.k, in.v);
  const auto cu_q = problem.cu_seqlens_q();
  const int total_q = problem.total_q(), dv = problem.head_dim_v;
  for (int b = 0; b < problem.batch; ++b) {
    const int sq = problem.seqlens_q[b], sk = problem.seqlens_k[b];
    for (int h = 0; h < problem.heads_q; ++h)
      for (int i = 0; i < sq; ++i) {
        // Straight from the spec: query i sits at key position i + sk - sq.
        const int diagonal = i + sk - sq;
        int first = 0, last = sk - 1;
        if (problem.window_left >= 0)
          first = std::max(first, diagonal - problem.window_left);
        if (problem.causal)
          last = std::min(last, diagonal);
        if (problem.window_right >= 0)
          last = std::min(last, diagonal + problem.window_right);
        const KeyInterval keys = first <= last ? KeyInterval{first, last + 1} : KeyInterval{};
        const Row expected = row_from_subproblem(problem, in, b, h, i, keys);
        const int token = cu_q[b] + i;
        const double lse = out.lse[size_t(h) * total_q + token];
        if (keys.empty()) {
          ASSERT_EQ(lse, -kInf) << problem.describe() << " row " << i;
        } else {
          ASSERT_NEAR(lse, expected.lse, kExactTolerance) << problem.describe() << " row " << i;
        }
        for (int c = 0; c < dv; ++c)
          ASSERT_NEAR(out.o[(size_t(token) * problem.heads_q + h) * dv + c], expected.o[c], kExactTolerance)
              << problem.describe() << " row " << i << " dim " << c;
      }
  }
}

TEST(ReferenceAttention, CausalIsBottomRightAligned) {
  const std::pair<int, int> shapes[] = {{3, 8}, {8, 3}, {5, 5}, {1, 7}, {7, 1}, {6, 0}};
  uint64_t seed = 100;
  for (auto [sq, sk] : shapes) {
    Problem problem = single(sq, sk, 2, 1, 16, 8);
    problem.causal = true;
    expect_rows_match_subproblems(problem, ++seed);
    // sq > sk: exactly the first sq - sk rows see no key.
    const Inputs in = random_inputs(problem, Dtype::bf16, seed);
    const Output out = attention_f64(problem, in.q, in.k, in.v);
    const auto empty_rows = std::count(out.lse.begin(), out.lse.end(), -kInf);
    EXPECT_EQ(empty_rows, problem.heads_q * std::max(0, sq - sk)) << problem.describe();
  }
}

TEST(ReferenceAttention, SlidingWindow) {
  struct Case {
    int sq, sk, left, right;
    bool causal;
  };
  const Case cases[] = {{6, 10, 2, 1, false}, {10, 6, 2, 1, false}, {7, 7, 0, 0, false}, {5, 9, 3, -1, true},
                        {9, 5, 3, -1, true},  {8, 8, -1, 2, false}, {4, 12, 4, 0, true}, {12, 4, 1, 3, false}};
  uint64_t seed = 200;
  for (const Case &c : cases) {
    Problem problem = single(c.sq, c.sk, 2, 2, 16, 16);
    problem.window_left = c.left;
    problem.window_right = c.right;
    problem.causal = c.causal;
    expect_rows_match_subproblems(problem, ++seed);
  }
}

TEST(ReferenceAttention, MaskIntervalMatchesPredicate) {
  const Mask masks[] = {{}, {true, -1, -1}, {false, 2, 1}, {true, 3, -1}, {false, -1, 0}, {true, 0, 5}, {false, 0, 0}};
  for (const Mask &mask : masks)
    for (int sq = 0; sq <= 9; ++sq)
      for (int sk = 0; sk <= 9; ++sk)
        for (int i = 0; i < sq; ++i) {
          const KeyInterval keys = visible_keys(mask, i, sq, sk);
          for (int j = -1; j <= sk; ++j)
            ASSERT_EQ(is_visible(mask, i, j, sq, sk), j >= keys.begin && j < keys.end)
                << "causal " << mask.causal << " window " << mask.window_left << "," << mask.window_right << " sq "
                << sq << " sk " << sk << " i " << i << " j " << j;
        }
}

TEST(ReferenceAttention, Softcap) {
  Problem problem = single(4, 6, 1, 1, 8, 8);
  problem.softcap = 2;
  const Inputs in = random_inputs(problem, Dtype::fp16, 300, 2); // logits large enough for tanh to bend
  const Output out = attention_f64(problem, in.q, in.k, in.v);
  const double scale = problem.softmax_scale();
  for (int i = 0; i < 4; ++i) {
    std::vector<double> logits(6);
    for (int j = 0; j < 6; ++j) {
      double dot = 0;
      for (int c = 0; c < 8; ++c)
        dot += double(in.q[i * 8 + c]) * in.k[j * 8 + c];
      logits[j] = 2 * std::tanh(dot * scale / 2);
    }
    const double max = *std::max_element(logits.begin(), logits.end());
    double sum = 0;
    for (double l : logits)
      sum += std::exp(l - max);
    EXPECT_NEAR(out.lse[i], max + std::log(sum), kExactTolerance);
    for (int c = 0; c < 8; ++c) {
      double o = 0;
      for (int j = 0; j < 6; ++j)
        o += std::exp(logits[j] - max) / sum * in.v[j * 8 + c];
      EXPECT_NEAR(out.o[i * 8 + c], o, kExactTolerance);
    }
  }
  // The cap must change the result (otherwise this test proves nothing).
  Problem uncapped = problem;
  uncapped.softcap = 0;
  EXPECT_GT(max_abs_diff(out.o, attention_f64(uncapped, in.q, in.k, in.v).o), 1e-3);
}

TEST(ReferenceAttention, GqaUsesConsecutiveQueryHeadsPerKvHead) {
  constexpr int kHeadsKv = 2, kSeqQ = 5, kSeqK = 9, kDim = 16;
  uint64_t seed = 400;
  for (int ratio : {1, 4, 6, 7, 8}) {
    Problem problem = single(kSeqQ, kSeqK, kHeadsKv * ratio, kHeadsKv, kDim, kDim);
    problem.causal = ratio % 2 == 0;
    const Inputs in = random_inputs(problem, Dtype::bf16, ++seed);
    // The same problem as plain MHA, each KV head copied to the `ratio` query heads that share it.
    Problem mha = problem;
    mha.heads_kv = problem.heads_q;
    std::vector<float> k, v;
    for (int j = 0; j < kSeqK; ++j)
      for (int h = 0; h < problem.heads_q; ++h) {
        const auto row = in.k.begin() + (size_t(j) * kHeadsKv + h / ratio) * kDim;
        k.insert(k.end(), row, row + kDim);
        const auto v_row = in.v.begin() + (size_t(j) * kHeadsKv + h / ratio) * kDim;
        v.insert(v.end(), v_row, v_row + kDim);
      }
    const Output gqa = attention_f64(problem, in.q, in.k, in.v), expanded = attention_f64(mha, in.q, k, v);
    EXPECT_LE(max_abs_diff(gqa.o, expanded.o), kExactTolerance) << "ratio " << ratio;
    EXPECT_LE(max_abs_diff(gqa.lse, expanded.lse), kExactTolerance) << "ratio " << ratio;
  }
}

TEST(ReferenceAttention, VarlenEqualsSeparateSequences) {
  for (bool causal : {false, true}) {
    Problem problem;
    problem.batch = 5;
    problem.seqlens_q = {5, 1, 0, 3, 4}; // a length-1 and a length-0 query sequence
    problem.seqlens_k = {7, 1, 4, 0, 9}; // a sequence with queries but no keys
    problem.heads_q = 4;
    problem.heads_kv = 2;
    problem.head_dim_qk = 24;
    problem.head_dim_v = 8;
    problem.causal = causal;
    const Inputs in = random_inputs(problem, Dtype::fp16, causal ? 501 : 500);
    const Output out = attention_f64(problem, in.q, in.k, in.v);
    const auto cu_q = problem.cu_seqlens_q(), cu_k = problem.cu_seqlens_k();
    const int total_q = problem.total_q();
    int empty_rows = 0;
    for (int b = 0; b < problem.batch; ++b) {
      Problem one = problem;
      one.batch = 1;
      one.seqlens_q = {problem.seqlens_q[b]};
      one.seqlens_k = {problem.seqlens_k[b]};
      auto slice = [](const std::vector<float> &t, size_t row_size, int first, int rows) {
        return std::vector<float>(t.begin() + size_t(first) * row_size, t.begin() + size_t(first + rows) * row_size);
      };
      const Output alone =
          attention_f64(one, slice(in.q, 4 * 24, cu_q[b], one.seqlens_q[0]),
                        slice(in.k, 2 * 24, cu_k[b], one.seqlens_k[0]), slice(in.v, 2 * 8, cu_k[b], one.seqlens_k[0]));
      for (size_t n = 0; n < alone.o.size(); ++n)
        ASSERT_EQ(out.o[size_t(cu_q[b]) * 4 * 8 + n], alone.o[n]) << "seq " << b;
      for (int h = 0; h < 4; ++h)
        for (int i = 0; i < one.seqlens_q[0]; ++i) {
          const double lse = out.lse[size_t(h) * total_q + cu_q[b] + i];
          ASSERT_EQ(lse, alone.lse[size_t(h) * one.seqlens_q[0] + i]) << "seq " << b;
          empty_rows += lse == -kInf;
        }
    }
    EXPECT_EQ(empty_rows, 4 * 3); // sequence 3: three queries, no keys
    const auto o_seq3 = out.o.begin() + size_t(cu_q[3]) * 4 * 8;
    EXPECT_TRUE(std::all_of(o_seq3, o_seq3 + 3 * 4 * 8, [](double x) { return x == 0; }));
  }
}

TEST(ReferenceAttention, LowPrecisionIsCloseButNotExact) {
  Problem problem = Problem::dense(2, 33, 70, 4, 2, 64, 64);
  problem.causal = true;
  for (Dtype dtype : {Dtype::fp16, Dtype::bf16}) {
    const Inputs in = random_inputs(problem, dtype, 600);
    const Output exact = attention_f64(problem, in.q, in.k, in.v);
    const Output low = attention_lowprec(problem, in.q, in.k, in.v, dtype);
    const double err = max_abs_diff(exact.o, low.o);
    EXPECT_GT(err, 0) << dtype_name(dtype);
    EXPECT_LT(err, dtype == Dtype::bf16 ? 2e-2 : 3e-3) << dtype_name(dtype);
    EXPECT_LT(max_abs_diff(exact.lse, low.lse), 1e-4) << dtype_name(dtype);
    for (double x : low.o)
      ASSERT_EQ(double(round_to(dtype, float(x))), x) << "O must be rounded to " << dtype_name(dtype);
  }
}

// naive_lowprec spelled out step by step for one head: fp32 logits and softmax, P rounded to the
// dtype, fp32 P·V, O rounded. Same operation order, so the results must agree bit for bit.
TEST(ReferenceAttention, LowPrecisionRoundsPBeforePV) {
  constexpr int kSeqQ = 6, kSeqK = 11, kDim = 16;
  const Problem problem = single(kSeqQ, kSeqK, 1, 1, kDim, kDim);
  for (Dtype dtype : {Dtype::fp16, Dtype::bf16}) {
    Inputs in = random_inputs(problem, dtype, 650);
    // Quarter steps in [-2, 2]: every dot product is exact in fp32 whatever order the reference sums in.
    constexpr float kSteps = 4, kLimit = 2;
    for (auto *tensor : {&in.q, &in.k})
      for (float &x : *tensor)
        x = std::clamp(std::round(x * kSteps) / kSteps, -kLimit, kLimit);
    const Output low = attention_lowprec(problem, in.q, in.k, in.v, dtype);
    const float scale = problem.softmax_scale();
    for (int i = 0; i < kSeqQ; ++i) {
      float logits[kSeqK], max = -std::numeric_limits<float>::infinity(), sum = 0;
      for (int j = 0; j < kSeqK; ++j) {
        float dot = 0;
        for (int c = 0; c < kDim; ++c)
          dot += in.q[i * kDim + c] * in.k[j * kDim + c];
        logits[j] = dot * scale;
        max = std::max(max, logits[j]);
      }
      for (int j = 0; j < kSeqK; ++j)
        sum += std::exp(logits[j] - max);
      for (int c = 0; c < kDim; ++c) {
        float acc = 0;
        for (int j = 0; j < kSeqK; ++j)
          acc += round_to(dtype, std::exp(logits[j] - max) / sum) * in.v[j * kDim + c];
        ASSERT_EQ(low.o[i * kDim + c], double(round_to(dtype, acc))) << dtype_name(dtype) << " row " << i;
      }
      ASSERT_EQ(low.lse[i], double(max + std::log(sum)));
    }
  }
}

TEST(ReferenceAttention, RejectsInconsistentInputs) {
  Problem problem = single(2, 3, 3, 2, 8, 8); // heads_q not a multiple of heads_kv
  const Inputs in = random_inputs(single(2, 3, 3, 3, 8, 8), Dtype::bf16, 1);
  EXPECT_THROW(attention_f64(problem, in.q, in.k, in.v), std::invalid_argument);
  problem.heads_kv = 3;
  EXPECT_THROW(attention_f64(problem, in.q, in.k, std::span<const float>(in.v).first(4)), std::invalid_argument);
}

TEST(ReferenceAttention, LayoutHelpers) {
  const Problem problem = Problem::dense(2, 3, 4, 2, 1, 8, 4);
  std::vector<double> lse(problem.lse_size());
  for (size_t n = 0; n < lse.size(); ++n)
    lse[n] = double(n); // [heads_q, total_q]: n = h * 6 + token
  const auto batch_major = lse_batch_major(problem, lse);
  // [batch, heads_q, seqlen_q]: batch 1, head 1, row 2 is token 5 of head 1.
  EXPECT_EQ(batch_major[(1 * 2 + 1) * 3 + 2], 1 * 6 + 5);
  EXPECT_EQ(o_coordinates(problem, (4 * 2 + 1) * 4 + 3), "token 4 (seq 1 row 1) head 1 dim 3");
  EXPECT_EQ(lse_coordinates(problem, 1 * 6 + 2), "head 1 token 2 (seq 0 row 2)");
}

// ---------------------------------------------------------------------------------------------
// The pass rule

struct CheckFixture : ::testing::Test {
  Problem problem = [] {
    Problem p = Problem::dense(2, 17, 9, 2, 1, 32, 32);
    p.causal = true; // sq > sk: rows with no key, LSE = -inf
    return p;
  }();
  Inputs in = random_inputs(problem, Dtype::bf16, 700);
  Output ref = attention_f64(problem, in.q, in.k, in.v);
  Output naive = attention_lowprec(problem, in.q, in.k, in.v, Dtype::bf16);

  static std::vector<float> to_float(const std::vector<double> &x) { return {x.begin(), x.end()}; }
};

TEST_F(CheckFixture, AcceptsReferenceAndNaive) {
  for (const Output *candidate : {&ref, &naive}) {
    const CheckResult o = check_output(to_float(candidate->o), ref.o, naive.o);
    EXPECT_TRUE(o.pass) << o.summary;
    EXPECT_EQ(o.count, ref.o.size());
    const CheckResult lse = check_lse(to_float(candidate->lse), ref.lse, naive.lse);
    EXPECT_TRUE(lse.pass) << lse.summary;
  }
  const CheckResult o = check_output(to_float(naive.o), ref.o, naive.o);
  EXPECT_GT(o.naive_err, 0);
  EXPECT_DOUBLE_EQ(o.bound, 2 * o.naive_err + 1e-5);
}

TEST_F(CheckFixture, RejectsPerturbedElement) {
  auto ours = to_float(naive.o);
  const CheckResult clean = check_output(ours, ref.o, naive.o);
  const size_t victim = ours.size() - 1; // the very last element: every element is checked
  ours[victim] += float(3 * clean.bound);
  const CheckResult result = check_output(ours, ref.o, naive.o);
  EXPECT_FALSE(result.pass);
  EXPECT_EQ(result.worst_index, victim);
  EXPECT_NE(result.summary.find("[" + std::to_string(victim) + "]"), std::string::npos) << result.summary;
  EXPECT_NE(result.summary.find("FAIL"), std::string::npos) << result.summary;
}

TEST_F(CheckFixture, RejectsNanAndInf) {
  for (float poison : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    auto ours = to_float(ref.o);
    const size_t victim = ours.size() / 2 + 3;
    ours[victim] = poison;
    const CheckResult result = check_output(ours, ref.o, naive.o);
    EXPECT_FALSE(result.pass) << result.summary;
    EXPECT_EQ(result.nonfinite, 1u);
    EXPECT_EQ(result.worst_index, victim);
  }
}

TEST_F(CheckFixture, LseMinusInfMustMatchExactly) {
  const auto empty = std::find(ref.lse.begin(), ref.lse.end(), -kInf);
  ASSERT_NE(empty, ref.lse.end());
  const size_t index = size_t(empty - ref.lse.begin());
  for (float wrong : {0.0f, -1e30f, std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    auto ours = to_float(ref.lse);
    ours[index] = wrong;
    const CheckResult result = check_lse(ours, ref.lse, naive.lse);
    EXPECT_FALSE(result.pass) << "ours " << wrong << ": " << result.summary;
    EXPECT_EQ(result.worst_index, index);
  }
  // And a finite reference LSE reported as -inf fails.
  auto ours = to_float(ref.lse);
  const size_t finite =
      size_t(std::find_if(ref.lse.begin(), ref.lse.end(), [](double x) { return x != -kInf; }) - ref.lse.begin());
  ours[finite] = -std::numeric_limits<float>::infinity();
  EXPECT_FALSE(check_lse(ours, ref.lse, naive.lse).pass);
}

TEST_F(CheckFixture, RejectsSizeMismatch) {
  auto ours = to_float(ref.o);
  ours.pop_back();
  EXPECT_FALSE(check_output(ours, ref.o, naive.o).pass);
}

// ---------------------------------------------------------------------------------------------
// Paged KV

Problem paged_problem() {
  Problem problem;
  problem.batch = 4;
  problem.seqlens_q = {3, 1, 2, 1};
  problem.seqlens_k = {37, 1, 0, 16};
  problem.heads_q = 4;
  problem.heads_kv = 2;
  problem.head_dim_qk = 16;
  problem.head_dim_v = 8;
  return problem;
}

TEST(ReferencePaged, GatherEqualsContiguous) {
  const Problem problem = paged_problem();
  const Inputs in = random_inputs(problem, Dtype::bf16, 800);
  for (int page_size : {1, 16, 7}) {
    for (PageGarbage garbage : {PageGarbage::large, PageGarbage::nan}) {
      const PagedKv paged = make_paged_kv(problem, in.k, in.v, page_size, 900 + page_size, garbage);
      const KvTensors back = gather_paged(paged);
      EXPECT_EQ(back.k, in.k) << "page size " << page_size;
      EXPECT_EQ(back.v, in.v) << "page size " << page_size;
    }
    const PagedKv paged = make_paged_kv(problem, in.k, in.v, page_size, 900 + page_size);
    // Used pages are distinct, there are spare pages, and the order is shuffled.
    std::set<int32_t> used;
    int in_natural_order = 0, count = 0;
    for (int b = 0; b < problem.batch; ++b)
      for (int p = 0; p < (problem.seqlens_k[b] + page_size - 1) / page_size; ++p) {
        const int32_t page = paged.block_table[size_t(b) * paged.max_pages_per_seq + p];
        ASSERT_GE(page, 0);
        ASSERT_LT(page, paged.num_pages);
        EXPECT_TRUE(used.insert(page).second) << "page " << page << " used twice";
        in_natural_order += page == count++;
      }
    EXPECT_GT(paged.num_pages, int(used.size()));
    EXPECT_LT(in_natural_order, count) << "block table is not shuffled";
    for (int32_t page : paged.block_table)
      ASSERT_TRUE(page >= 0 && page < paged.num_pages); // padding entries too: a stray read stays in bounds
    // The tail of sequence 0's last page holds garbage, not zeros or another sequence's keys.
    if (37 % page_size != 0) {
      const int32_t last = paged.block_table[37 / page_size];
      const float garbage = paged.k_pages[(size_t(last) * page_size + page_size - 1) * 2 * 16];
      EXPECT_GE(std::abs(garbage), 64.0f);
    }
  }
}

} // namespace
} // namespace flashjit::ref
