// CPU model of the split-K decode math against float64: the base-2 online softmax a warp runs over
// its keys, the cross-warp merge at the end of a piece, and the (O, LSE) merge of partial states
// that fj_decode_combine / fj_combine perform, including states that saw no key (LSE = -inf).
// The model mirrors the kernels' float32 operations and order; the reference is exact attention.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

namespace {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

struct State {
  std::vector<float> o; // normalized over the state's keys
  float lse = kNegInf;  // natural log
};

// The kernel's per-warp loop: logits in base 2, running max with the -inf guard, rescaling.
struct WarpModel {
  float row_max = kNegInf, row_sum = 0.f;
  std::vector<float> o;
  explicit WarpModel(int dv) : o(dv, 0.f) {}
  void tile(const std::vector<float> &logits2, const std::vector<std::vector<float>> &v) {
    float tile_max = kNegInf;
    for (float x : logits2)
      tile_max = std::max(tile_max, x);
    const float new_max = std::max(row_max, tile_max);
    const float shift = new_max == kNegInf ? 0.f : new_max;
    const float correction = std::exp2(row_max - shift);
    row_max = new_max;
    float sum = 0.f;
    for (float &o_d : o)
      o_d *= correction;
    for (size_t j = 0; j < logits2.size(); ++j) {
      const float p = std::exp2(logits2[j] - shift);
      sum += p;
      for (size_t d = 0; d < o.size(); ++d)
        o[d] += p * v[j][d];
    }
    row_sum = row_sum * correction + sum;
  }
};

// End of a piece: merge the warps into one normalized state (finish_piece).
State merge_warps(const std::vector<WarpModel> &warps) {
  State s;
  s.o.assign(warps[0].o.size(), 0.f);
  float max_all = kNegInf;
  for (const WarpModel &w : warps)
    max_all = std::max(max_all, w.row_max);
  if (max_all == kNegInf)
    return s;
  float total = 0.f;
  std::vector<float> weight;
  for (const WarpModel &w : warps) {
    weight.push_back(std::exp2(w.row_max - max_all));
    total += weight.back() * w.row_sum;
  }
  for (size_t d = 0; d < s.o.size(); ++d) {
    float acc = 0.f;
    for (size_t i = 0; i < warps.size(); ++i)
      acc += weight[i] * warps[i].o[d];
    s.o[d] = acc / total;
  }
  s.lse = (max_all + std::log2(total)) * kLn2;
  return s;
}

// merge_states_row: LSE-weighted sum of normalized states.
State merge_states(const std::vector<State> &states) {
  State out;
  out.o.assign(states[0].o.size(), 0.f);
  float max_lse = kNegInf;
  for (const State &s : states)
    max_lse = std::max(max_lse, s.lse);
  if (max_lse == kNegInf)
    return out;
  float sum = 0.f;
  for (const State &s : states)
    sum += std::exp2((s.lse - max_lse) * kLog2e);
  for (const State &s : states) {
    const float weight = std::exp2((s.lse - max_lse) * kLog2e) / sum;
    if (weight == 0.f)
      continue; // an empty state's O is never read
    for (size_t d = 0; d < out.o.size(); ++d)
      out.o[d] += weight * s.o[d];
  }
  out.lse = max_lse + std::log2(sum) * kLn2;
  return out;
}

struct Row {
  std::vector<double> logits; // natural, already scaled; -inf = masked
  std::vector<std::vector<float>> v;
};

void reference(const Row &row, std::vector<double> *o, double *lse) {
  const size_t dv = row.v.empty() ? 0 : row.v[0].size();
  o->assign(dv, 0.0);
  double mx = -std::numeric_limits<double>::infinity();
  for (double x : row.logits)
    mx = std::max(mx, x);
  if (std::isinf(mx)) {
    *lse = mx;
    return;
  }
  double sum = 0;
  for (double x : row.logits)
    sum += std::exp(x - mx);
  for (size_t j = 0; j < row.logits.size(); ++j)
    for (size_t d = 0; d < dv; ++d)
      (*o)[d] += std::exp(row.logits[j] - mx) / sum * row.v[j][d];
  *lse = mx + std::log(sum);
}

// One piece of keys [begin, end) through `warps` warps of `warp_keys` keys per tile.
State run_piece(const Row &row, size_t begin, size_t end, int warps, int warp_keys, int dv) {
  std::vector<WarpModel> model(warps, WarpModel(dv));
  const size_t tile = size_t(warps) * warp_keys;
  for (size_t t = begin; t < end; t += tile)
    for (int w = 0; w < warps; ++w) {
      std::vector<float> logits2;
      std::vector<std::vector<float>> v;
      for (int j = 0; j < warp_keys; ++j) {
        const size_t key = t + size_t(w) * warp_keys + j;
        const bool in = key < end;
        logits2.push_back(in ? float(row.logits[key]) * kLog2e : kNegInf);
        v.push_back(in ? row.v[key] : std::vector<float>(dv, 0.f));
      }
      model[w].tile(logits2, v);
    }
  return merge_warps(model);
}

Row random_row(std::mt19937 &rng, int keys, int dv, double masked_fraction, double spread) {
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  Row row;
  for (int j = 0; j < keys; ++j) {
    row.logits.push_back(unit(rng) < masked_fraction ? -std::numeric_limits<double>::infinity() : u(rng) * spread);
    std::vector<float> v(dv);
    for (float &x : v)
      x = float(u(rng));
    row.v.push_back(v);
  }
  return row;
}

double max_abs_diff(const std::vector<float> &a, const std::vector<double> &b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i)
    m = std::max(m, std::fabs(double(a[i]) - b[i]));
  return m;
}

TEST(MergeMath, SplitPiecesMergeToFullAttention) {
  std::mt19937 rng(11);
  constexpr int kDv = 24;
  constexpr double kTolerance = 2e-5; // float32 accumulation over a few thousand keys
  for (int trial = 0; trial < 40; ++trial) {
    const int keys = 1 + int(rng() % 3000);
    const Row row = random_row(rng, keys, kDv, trial % 4 == 0 ? 0.5 : 0.0, trial % 3 == 0 ? 30.0 : 4.0);
    std::vector<double> ref;
    double ref_lse = 0;
    reference(row, &ref, &ref_lse);
    // Random cut points on 64-key tile boundaries, as the schedule makes them.
    std::vector<size_t> cuts = {0};
    while (cuts.back() < size_t(keys))
      cuts.push_back(std::min<size_t>(keys, cuts.back() + 64 * (1 + rng() % 8)));
    std::vector<State> states;
    for (size_t i = 0; i + 1 < cuts.size(); ++i)
      states.push_back(run_piece(row, cuts[i], cuts[i + 1], 4, 16, kDv));
    const State merged = merge_states(states);
    if (std::isinf(ref_lse)) {
      EXPECT_TRUE(std::isinf(merged.lse) && merged.lse < 0);
      for (float x : merged.o)
        EXPECT_EQ(x, 0.f);
      continue;
    }
    EXPECT_LE(max_abs_diff(merged.o, ref), kTolerance) << "trial " << trial;
    EXPECT_NEAR(merged.lse, ref_lse, 1e-4 * std::max(1.0, std::fabs(ref_lse))) << "trial " << trial;
  }
}

TEST(MergeMath, EmptyStatesWeighNothing) {
  std::mt19937 rng(3);
  constexpr int kDv = 8;
  const Row row = random_row(rng, 200, kDv, 0.0, 3.0);
  std::vector<double> ref;
  double ref_lse = 0;
  reference(row, &ref, &ref_lse);
  State full = run_piece(row, 0, 200, 4, 16, kDv);
  State empty;
  empty.o.assign(kDv, std::numeric_limits<float>::quiet_NaN()); // never read
  const State merged = merge_states({empty, full, empty});
  EXPECT_LE(max_abs_diff(merged.o, ref), 1e-5);
  EXPECT_NEAR(merged.lse, ref_lse, 1e-4);
}

TEST(MergeMath, AllEmptyGivesZeroAndMinusInfinity) {
  constexpr int kDv = 8;
  State a, b;
  a.o.assign(kDv, 1.f);
  b.o.assign(kDv, std::numeric_limits<float>::quiet_NaN());
  const State merged = merge_states({a, b});
  EXPECT_TRUE(std::isinf(merged.lse) && merged.lse < 0);
  for (float x : merged.o)
    EXPECT_EQ(x, 0.f);
  // A piece whose keys are all masked produces exactly that state.
  std::mt19937 rng(5);
  const Row masked = random_row(rng, 100, kDv, 1.0, 1.0);
  const State piece = run_piece(masked, 0, 100, 4, 16, kDv);
  EXPECT_TRUE(std::isinf(piece.lse) && piece.lse < 0);
  for (float x : piece.o)
    EXPECT_EQ(x, 0.f);
}

TEST(MergeMath, LargeLseGapsDoNotOverflow) {
  // States whose LSEs differ by hundreds: exp of the raw LSE would overflow float32.
  constexpr int kDv = 4;
  State big, small;
  big.o = {1.f, 2.f, 3.f, 4.f};
  big.lse = 500.f;
  small.o = {-1.f, -1.f, -1.f, -1.f};
  small.lse = -300.f;
  const State merged = merge_states({small, big});
  for (int d = 0; d < kDv; ++d)
    EXPECT_FLOAT_EQ(merged.o[d], big.o[d]);
  EXPECT_FLOAT_EQ(merged.lse, 500.f);
  State twin = big;
  const State doubled = merge_states({big, twin});
  EXPECT_NEAR(doubled.lse, 500.0 + std::log(2.0), 1e-4);
}

} // namespace
