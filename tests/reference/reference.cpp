#include "tests/reference/reference.hpp"

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstdio>
#include <limits>
#include <numeric>
#include <sstream>
#include <stdexcept>
#include <thread>

namespace flashjit::ref {

namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// --- IEEE single precision fields
constexpr uint32_t kF32SignMask = 0x80000000u;
constexpr uint32_t kF32AbsMask = 0x7FFFFFFFu;
constexpr uint32_t kF32InfBits = 0x7F800000u;
constexpr uint32_t kF32MantissaMask = 0x007FFFFFu;
constexpr uint32_t kF32ImplicitBit = 0x00800000u;
constexpr int kF32MantissaBits = 23;
constexpr int kF32ExponentBias = 127;

// --- bfloat16: the upper half of a float
constexpr int kBf16Shift = 16;
constexpr uint32_t kBf16RoundBias = 0x7FFFu; // below half an ulp; the ulp's low bit breaks ties to even
constexpr uint16_t kBf16QuietBit = 0x0040u;

// --- IEEE half precision fields
constexpr uint16_t kF16SignMask = 0x8000u;
constexpr uint16_t kF16InfBits = 0x7C00u;
constexpr uint16_t kF16QuietNan = 0x7E00u;
constexpr uint16_t kF16MantissaMask = 0x03FFu;
constexpr int kF16MantissaBits = 10;
constexpr int kF16ExponentBias = 15;
constexpr int kF16MaxExponentField = 31;
constexpr int kF16MinNormalExponent = 1 - kF16ExponentBias;                         // 2^-14
constexpr int kF16SubnormalUnitExponent = kF16MinNormalExponent - kF16MantissaBits; // 2^-24
constexpr int kMantissaDrop = kF32MantissaBits - kF16MantissaBits;                  // 13 bits dropped
constexpr uint32_t kF16OverflowBits = 0x477FF000u; // 65520.0f: ties to 65536, which is inf in fp16
constexpr int kMaxShift = 31;

uint32_t bits_of(float value) {
  return std::bit_cast<uint32_t>(value);
}

// Round `value` right by `shift` bits to nearest, ties to even.
uint32_t shift_round_even(uint32_t value, int shift) {
  if (shift == 0)
    return value;
  if (shift > kMaxShift)
    return 0;
  const uint32_t kept = value >> shift;
  const uint32_t rest = value & ((1u << shift) - 1);
  const uint32_t half = 1u << (shift - 1);
  return kept + ((rest > half || (rest == half && (kept & 1u))) ? 1u : 0u);
}

// SplitMix64: tiny, seedable and identical on every platform (std:: distributions are not).
struct SplitMix64 {
  static constexpr uint64_t kGamma = 0x9E3779B97F4A7C15ull;
  uint64_t state;
  // The generator `draws` draws after SplitMix64{seed}: its state only ever adds kGamma.
  static SplitMix64 after(uint64_t seed, uint64_t draws) { return {seed + draws * kGamma}; }
  uint64_t next() {
    constexpr uint64_t kMul1 = 0xBF58476D1CE4E5B9ull;
    constexpr uint64_t kMul2 = 0x94D049BB133111EBull;
    uint64_t z = (state += kGamma);
    z = (z ^ (z >> 30)) * kMul1;
    z = (z ^ (z >> 27)) * kMul2;
    return z ^ (z >> 31);
  }
  // Uniform in (0, 1]: never 0, so log() in Box-Muller stays finite.
  double uniform() {
    constexpr int kMantissaBitsF64 = 53;
    constexpr double kUnit = 1.0 / double(1ull << kMantissaBitsF64);
    return double((next() >> (64 - kMantissaBitsF64)) + 1) * kUnit;
  }
  uint64_t below(uint64_t bound) { return next() % bound; }
};

void require(bool condition, const std::string &message) {
  if (!condition)
    throw std::invalid_argument(message);
}

void require_size(std::span<const float> tensor, size_t expected, const char *name) {
  require(tensor.size() == expected, std::string(name) + " has " + std::to_string(tensor.size()) +
                                         " elements, the problem needs " + std::to_string(expected));
}

std::vector<int32_t> prefix_sums(const std::vector<int> &lengths) {
  std::vector<int32_t> sums(lengths.size() + 1, 0);
  std::partial_sum(lengths.begin(), lengths.end(), sums.begin() + 1);
  return sums;
}

std::string format_double(double value) {
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "%.6g", value);
  return buffer;
}

// Four independent partial sums: the loop pipelines (and vectorizes) instead of waiting on one
// running sum, which makes the reference several times faster on the large GPU test problems.
template <typename Real> Real dot_product(const float *a, const float *b, int n) {
  constexpr int kLanes = 4;
  Real lanes[kLanes] = {};
  int c = 0;
  for (; c + kLanes <= n; c += kLanes)
    for (int l = 0; l < kLanes; ++l)
      lanes[l] += Real(a[c + l]) * Real(b[c + l]);
  for (; c < n; ++c)
    lanes[0] += Real(a[c]) * Real(b[c]);
  return (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
}

// The two reference flavours share the loop nest; only the arithmetic type and the rounding differ.
// `round_lowprec` is null for float64 and the dtype's rounding for naive_lowprec.
template <typename Real>
Output naive_attention(const Problem &problem, std::span<const float> q, std::span<const float> k,
                       std::span<const float> v, float (*round_lowprec)(Dtype, float), Dtype dtype) {
  problem.validate();
  require_size(q, problem.q_size(), "q");
  require_size(k, problem.k_size(), "k");
  require_size(v, problem.v_size(), "v");

  const int dqk = problem.head_dim_qk, dv = problem.head_dim_v;
  const int total_q = problem.total_q();
  const Real scale = Real(problem.softmax_scale());
  const Real softcap = Real(problem.softcap);
  const Mask mask = problem.mask();
  const auto cu_q = problem.cu_seqlens_q(), cu_k = problem.cu_seqlens_k();

  Output out;
  out.o.assign(problem.o_size(), 0.0);
  out.lse.assign(problem.lse_size(), kNegInf);

  // Rows are independent, so chunks of rows run on all cores (GPU tests check large problems); each
  // row is computed in the same order whatever the thread count, so results are deterministic.
  constexpr int kRowsPerChunk = 16;
  struct Chunk {
    int seq, head, row_begin, row_end;
  };
  std::vector<Chunk> chunks;
  for (int b = 0; b < problem.batch; ++b)
    for (int h = 0; h < problem.heads_q; ++h)
      for (int i = 0; i < problem.seqlens_q[b]; i += kRowsPerChunk)
        chunks.push_back({b, h, i, std::min(problem.seqlens_q[b], i + kRowsPerChunk)});

  parallel_for(chunks.size(), [&](size_t n) {
    const Chunk &chunk = chunks[n];
    std::vector<Real> logits, acc;
    std::vector<char> visible;
    const int b = chunk.seq, h = chunk.head;
    const int sq = problem.seqlens_q[b], sk = problem.seqlens_k[b];
    const int hk = problem.kv_head(h);
    for (int i = chunk.row_begin; i < chunk.row_end; ++i) {
      const int token = cu_q[b] + i;
      const float *q_row = &q[(size_t(token) * problem.heads_q + h) * dqk];
      logits.assign(sk, Real(0));
      visible.assign(sk, 0);
      Real row_max = -std::numeric_limits<Real>::infinity();
      for (int j = 0; j < sk; ++j) {
        if (!is_visible(mask, i, j, sq, sk))
          continue;
        const float *k_row = &k[(size_t(cu_k[b] + j) * problem.heads_kv + hk) * dqk];
        const Real dot = dot_product<Real>(q_row, k_row, dqk);
        const Real logit = softcap > 0 ? softcap * std::tanh(dot * scale / softcap) : dot * scale;
        logits[j] = logit;
        visible[j] = 1;
        row_max = std::max(row_max, logit);
      }
      if (row_max == -std::numeric_limits<Real>::infinity())
        continue; // no visible key: O stays 0 and LSE -inf
      Real sum = 0;
      for (int j = 0; j < sk; ++j)
        if (visible[j]) {
          logits[j] = std::exp(logits[j] - row_max); // from here on: the unnormalized probability
          sum += logits[j];
        }
      acc.assign(dv, Real(0));
      for (int j = 0; j < sk; ++j) {
        if (!visible[j])
          continue;
        Real p = logits[j] / sum;
        if (round_lowprec)
          p = Real(round_lowprec(dtype, float(p)));
        const float *v_row = &v[(size_t(cu_k[b] + j) * problem.heads_kv + hk) * dv];
        for (int c = 0; c < dv; ++c)
          acc[c] += p * Real(v_row[c]);
      }
      double *o_row = &out.o[(size_t(token) * problem.heads_q + h) * dv];
      for (int c = 0; c < dv; ++c)
        o_row[c] = round_lowprec ? double(round_lowprec(dtype, float(acc[c]))) : double(acc[c]);
      out.lse[size_t(h) * total_q + token] = double(row_max + std::log(sum));
    }
  });
  return out;
}

} // namespace

void parallel_for(size_t count, const std::function<void(size_t)> &body) {
  std::atomic<size_t> next{0};
  auto worker = [&] {
    for (size_t n = next++; n < count; n = next++)
      body(n);
  };
  const size_t threads = std::min<size_t>(count, std::max(1u, std::thread::hardware_concurrency()));
  std::vector<std::thread> pool;
  for (size_t t = 1; t < threads; ++t)
    pool.emplace_back(worker);
  worker();
  for (std::thread &thread : pool)
    thread.join();
}

// ---------------------------------------------------------------------------------------------
// 16-bit conversions

const char *dtype_name(Dtype dtype) {
  return dtype == Dtype::fp16 ? "fp16" : "bf16";
}

uint16_t float_to_bf16(float value) {
  const uint32_t bits = bits_of(value);
  if ((bits & kF32AbsMask) > kF32InfBits) // NaN: keep sign and top payload, force quiet
    return uint16_t((bits >> kBf16Shift) | kBf16QuietBit);
  const uint32_t lsb = (bits >> kBf16Shift) & 1u;
  // Overflow carries into the exponent and lands on inf, as round-to-nearest requires.
  return uint16_t((bits + kBf16RoundBias + lsb) >> kBf16Shift);
}

float bf16_to_float(uint16_t bits) {
  return std::bit_cast<float>(uint32_t(bits) << kBf16Shift);
}

uint16_t float_to_fp16(float value) {
  const uint32_t bits = bits_of(value);
  const uint16_t sign = uint16_t((bits & kF32SignMask) >> kBf16Shift);
  const uint32_t abs = bits & kF32AbsMask;
  if (abs > kF32InfBits)
    return sign | kF16QuietNan;
  if (abs >= kF16OverflowBits)
    return sign | kF16InfBits;
  const int exponent = int(abs >> kF32MantissaBits) - kF32ExponentBias;
  if (exponent < kF16MinNormalExponent) {
    if (exponent < -kF32ExponentBias + 1)
      return sign; // float subnormals are far below half of fp16's smallest subnormal
    // Count in units of fp16's smallest subnormal, 2^-24; rounding may carry into the smallest normal.
    const uint32_t mantissa = (abs & kF32MantissaMask) | kF32ImplicitBit;
    const int shift = kF32MantissaBits - (exponent - kF16SubnormalUnitExponent);
    return uint16_t(sign | shift_round_even(mantissa, shift));
  }
  // Normal: rebias the exponent, round off the low mantissa bits (a carry bumps the exponent, correctly).
  const uint32_t rebased = abs - (uint32_t(kF32ExponentBias - kF16ExponentBias) << kF32MantissaBits);
  return uint16_t(sign | shift_round_even(rebased, kMantissaDrop));
}

float fp16_to_float(uint16_t bits) {
  const uint32_t sign = uint32_t(bits & kF16SignMask) << kBf16Shift;
  const int exponent_field = (bits >> kF16MantissaBits) & kF16MaxExponentField;
  const uint32_t mantissa = bits & kF16MantissaMask;
  if (exponent_field == 0) { // zero or subnormal: mantissa * 2^-24, exact in float
    const float magnitude = std::ldexp(float(mantissa), kF16SubnormalUnitExponent);
    return sign ? -magnitude : magnitude;
  }
  if (exponent_field == kF16MaxExponentField)
    return std::bit_cast<float>(sign | kF32InfBits | (mantissa << kMantissaDrop));
  const uint32_t exponent = uint32_t(exponent_field - kF16ExponentBias + kF32ExponentBias);
  return std::bit_cast<float>(sign | (exponent << kF32MantissaBits) | (mantissa << kMantissaDrop));
}

uint16_t to_bits(Dtype dtype, float value) {
  return dtype == Dtype::fp16 ? float_to_fp16(value) : float_to_bf16(value);
}

float from_bits(Dtype dtype, uint16_t bits) {
  return dtype == Dtype::fp16 ? fp16_to_float(bits) : bf16_to_float(bits);
}

float round_to(Dtype dtype, float value) {
  return from_bits(dtype, to_bits(dtype, value));
}

// ---------------------------------------------------------------------------------------------
// Masks

bool is_visible(const Mask &mask, int query, int key, int seqlen_q, int seqlen_k) {
  if (key < 0 || key >= seqlen_k || query < 0 || query >= seqlen_q)
    return false;
  const int64_t diagonal = int64_t(query) + seqlen_k - seqlen_q; // bottom-right alignment
  if (mask.causal && key > diagonal)
    return false;
  if (mask.window_left >= 0 && key < diagonal - mask.window_left)
    return false;
  if (mask.window_right >= 0 && key > diagonal + mask.window_right)
    return false;
  return true;
}

KeyInterval visible_keys(const Mask &mask, int query, int seqlen_q, int seqlen_k) {
  const int64_t diagonal = int64_t(query) + seqlen_k - seqlen_q;
  int64_t begin = 0, end = seqlen_k;
  if (mask.window_left >= 0)
    begin = std::max<int64_t>(begin, diagonal - mask.window_left);
  if (mask.causal)
    end = std::min<int64_t>(end, diagonal + 1);
  if (mask.window_right >= 0)
    end = std::min<int64_t>(end, diagonal + mask.window_right + 1);
  if (begin >= end)
    return {0, 0};
  return {int(begin), int(end)};
}

// ---------------------------------------------------------------------------------------------
// Problem

Problem Problem::dense(int batch, int seqlen_q, int seqlen_k, int heads_q, int heads_kv, int head_dim_qk,
                       int head_dim_v) {
  Problem problem;
  problem.batch = batch;
  problem.seqlens_q.assign(batch, seqlen_q);
  problem.seqlens_k.assign(batch, seqlen_k);
  problem.heads_q = heads_q;
  problem.heads_kv = heads_kv;
  problem.head_dim_qk = head_dim_qk;
  problem.head_dim_v = head_dim_v;
  return problem;
}

float Problem::softmax_scale() const {
  // The kernels receive a float scale, so the reference uses the same float value.
  return scale != 0 ? scale : float(1.0 / std::sqrt(double(head_dim_qk)));
}

int Problem::total_q() const {
  return std::accumulate(seqlens_q.begin(), seqlens_q.end(), 0);
}
int Problem::total_k() const {
  return std::accumulate(seqlens_k.begin(), seqlens_k.end(), 0);
}
int Problem::max_seqlen_q() const {
  return seqlens_q.empty() ? 0 : *std::max_element(seqlens_q.begin(), seqlens_q.end());
}
int Problem::max_seqlen_k() const {
  return seqlens_k.empty() ? 0 : *std::max_element(seqlens_k.begin(), seqlens_k.end());
}
std::vector<int32_t> Problem::cu_seqlens_q() const {
  return prefix_sums(seqlens_q);
}
std::vector<int32_t> Problem::cu_seqlens_k() const {
  return prefix_sums(seqlens_k);
}

void Problem::validate() const {
  require(batch >= 1, "batch must be >= 1");
  require(int(seqlens_q.size()) == batch, "seqlens_q needs one entry per sequence");
  require(int(seqlens_k.size()) == batch, "seqlens_k needs one entry per sequence");
  for (int b = 0; b < batch; ++b)
    require(seqlens_q[b] >= 0 && seqlens_k[b] >= 0, "sequence " + std::to_string(b) + " has a negative length");
  require(heads_q >= 1 && heads_kv >= 1, "heads must be >= 1");
  require(heads_q % heads_kv == 0, "heads_q must be a multiple of heads_kv");
  require(head_dim_qk >= 1 && head_dim_v >= 1, "head dims must be >= 1");
  require(softcap >= 0 && std::isfinite(softcap), "softcap must be finite and >= 0");
  require(std::isfinite(scale), "scale must be finite");
}

std::string Problem::describe() const {
  std::ostringstream text;
  auto list = [&](const std::vector<int> &lengths) {
    text << '[';
    for (size_t i = 0; i < lengths.size(); ++i)
      text << (i ? "," : "") << lengths[i];
    text << ']';
  };
  text << 'b' << batch << " sq";
  list(seqlens_q);
  text << " sk";
  list(seqlens_k);
  text << " h" << heads_q << '/' << heads_kv << " d" << head_dim_qk << 'v' << head_dim_v;
  if (causal)
    text << " causal";
  if (window_left >= 0 || window_right >= 0)
    text << " window(" << window_left << ',' << window_right << ')';
  if (softcap > 0)
    text << " softcap" << softcap;
  if (scale != 0)
    text << " scale" << scale;
  return text.str();
}

// ---------------------------------------------------------------------------------------------
// Reference attention

Output attention_f64(const Problem &problem, std::span<const float> q, std::span<const float> k,
                     std::span<const float> v) {
  return naive_attention<double>(problem, q, k, v, nullptr, Dtype::bf16);
}

Output attention_lowprec(const Problem &problem, std::span<const float> q, std::span<const float> k,
                         std::span<const float> v, Dtype dtype) {
  return naive_attention<float>(problem, q, k, v, &round_to, dtype);
}

std::vector<double> lse_batch_major(const Problem &problem, std::span<const double> lse) {
  require(lse.size() == problem.lse_size(), "lse size does not match the problem");
  const int seqlen_q = problem.seqlens_q.front();
  for (int length : problem.seqlens_q)
    require(length == seqlen_q, "batch-major LSE needs equal seqlens_q");
  const int total_q = problem.total_q();
  std::vector<double> out(lse.size());
  for (int b = 0; b < problem.batch; ++b)
    for (int h = 0; h < problem.heads_q; ++h)
      for (int i = 0; i < seqlen_q; ++i)
        out[(size_t(b) * problem.heads_q + h) * seqlen_q + i] = lse[size_t(h) * total_q + b * seqlen_q + i];
  return out;
}

namespace {
std::string token_coordinates(const Problem &problem, int token) {
  const auto cu_q = problem.cu_seqlens_q();
  const int seq = int(std::upper_bound(cu_q.begin(), cu_q.end(), token) - cu_q.begin()) - 1;
  return "token " + std::to_string(token) + " (seq " + std::to_string(seq) + " row " +
         std::to_string(token - cu_q[seq]) + ")";
}
} // namespace

std::string o_coordinates(const Problem &problem, size_t index) {
  const size_t row = index / problem.head_dim_v;
  const int token = int(row / problem.heads_q);
  return token_coordinates(problem, token) + " head " + std::to_string(row % problem.heads_q) + " dim " +
         std::to_string(index % problem.head_dim_v);
}

std::string lse_coordinates(const Problem &problem, size_t index) {
  const int total_q = problem.total_q();
  return "head " + std::to_string(index / total_q) + " " + token_coordinates(problem, int(index % total_q));
}

// ---------------------------------------------------------------------------------------------
// Pass rule

CheckResult check_output(std::span<const float> ours, std::span<const double> ref64, std::span<const double> naive,
                         const std::string &name) {
  constexpr double kNaiveFactor = 2.0;    // FlashAttention's rule: at most twice the naive low-precision error
  constexpr double kAbsoluteSlack = 1e-5; // keeps the bound positive when naive happens to be exact

  CheckResult result;
  result.count = ours.size();
  if (ours.size() != ref64.size() || naive.size() != ref64.size()) {
    result.summary = name + " FAIL: sizes differ (ours " + std::to_string(ours.size()) + ", ref64 " +
                     std::to_string(ref64.size()) + ", naive " + std::to_string(naive.size()) + ")";
    return result;
  }
  size_t worst_err_index = 0, first_nonfinite = 0, broken_reference = 0;
  for (size_t i = 0; i < ours.size(); ++i) {
    const double mine = ours[i], expected = ref64[i];
    if (!std::isfinite(expected)) {
      // -inf LSE of a row that sees no key: must be reproduced exactly (NaN != NaN fails too).
      if (mine != expected && result.nonfinite++ == 0)
        first_nonfinite = i;
      if (naive[i] != expected)
        ++broken_reference;
      continue;
    }
    if (!std::isfinite(mine)) {
      if (result.nonfinite++ == 0)
        first_nonfinite = i;
      continue;
    }
    if (!std::isfinite(naive[i])) {
      ++broken_reference;
      continue;
    }
    const double err = std::abs(mine - expected);
    if (err > result.max_err) {
      result.max_err = err;
      worst_err_index = i;
    }
    result.naive_err = std::max(result.naive_err, std::abs(naive[i] - expected));
  }
  result.bound = kNaiveFactor * result.naive_err + kAbsoluteSlack;
  result.pass = result.nonfinite == 0 && broken_reference == 0 && result.max_err <= result.bound;
  result.worst_index = result.nonfinite ? first_nonfinite : worst_err_index;

  std::ostringstream text;
  text << name << (result.pass ? " PASS" : " FAIL") << ": max_err " << format_double(result.max_err)
       << (result.max_err <= result.bound ? " <= " : " > ") << "bound " << format_double(result.bound) << " (naive_err "
       << format_double(result.naive_err) << ")";
  if (!ours.empty()) {
    const size_t w = result.worst_index;
    text << "; worst [" << w << "] ours " << format_double(ours[w]) << " ref64 " << format_double(ref64[w]) << " naive "
         << format_double(naive[w]);
  }
  if (result.nonfinite)
    text << "; " << result.nonfinite << " non-finite mismatches, first at [" << first_nonfinite << "]";
  if (broken_reference)
    text << "; " << broken_reference << " elements where naive disagrees with ref64 on finiteness";
  text << "; " << result.count << " elements";
  result.summary = text.str();
  return result;
}

CheckResult check_lse(std::span<const float> ours, std::span<const double> ref64, std::span<const double> naive) {
  return check_output(ours, ref64, naive, "LSE");
}

// ---------------------------------------------------------------------------------------------
// Random inputs

std::vector<float> random_tensor(size_t n, Dtype dtype, uint64_t seed, float scale, bool parallel) {
  constexpr double kTwoPi = 6.283185307179586;
  constexpr size_t kDrawsPerPair = 2;        // Box-Muller yields normals in pairs, from two uniforms
  constexpr size_t kPairsPerChunk = 1 << 18; // chunks of the stream, filled side by side: the same values
  std::vector<float> out(n);
  const size_t pairs = (n + 1) / 2;
  auto fill = [&](size_t chunk) {
    const size_t first = chunk * kPairsPerChunk, last = std::min(pairs, first + kPairsPerChunk);
    SplitMix64 rng = SplitMix64::after(seed, first * kDrawsPerPair);
    for (size_t pair = first; pair < last; ++pair) {
      const size_t i = 2 * pair;
      const double radius = std::sqrt(-2.0 * std::log(rng.uniform()));
      const double angle = kTwoPi * rng.uniform();
      out[i] = round_to(dtype, float(scale * radius * std::cos(angle)));
      if (i + 1 < n)
        out[i + 1] = round_to(dtype, float(scale * radius * std::sin(angle)));
    }
  };
  const size_t chunks = (pairs + kPairsPerChunk - 1) / kPairsPerChunk;
  if (parallel)
    parallel_for(chunks, fill);
  else
    for (size_t chunk = 0; chunk < chunks; ++chunk)
      fill(chunk);
  // A zero tensor hides bugs; with a tiny scale every value could underflow, so force one nonzero:
  // the scale itself, or the dtype's smallest subnormal when even that underflows.
  constexpr uint16_t kSmallestSubnormalBits = 1;
  auto is_zero = [](float x) { return x == 0.0f; };
  if (n > 0 && std::all_of(out.begin(), out.end(), is_zero)) {
    out[0] = round_to(dtype, scale);
    if (is_zero(out[0]))
      out[0] = from_bits(dtype, kSmallestSubnormalBits);
  }
  return out;
}

Inputs random_inputs(const Problem &problem, Dtype dtype, uint64_t seed, float scale) {
  // One stream per tensor: seeds this far apart put SplitMix64 states far apart, so streams do not overlap.
  constexpr uint64_t kStreamStride = 0xD1B54A32D192ED03ull;
  return {random_tensor(problem.q_size(), dtype, seed, scale),
          random_tensor(problem.k_size(), dtype, seed + kStreamStride, scale),
          random_tensor(problem.v_size(), dtype, seed + 2 * kStreamStride, scale)};
}

double max_abs_diff(std::span<const double> a, std::span<const double> b) {
  constexpr double kInf = std::numeric_limits<double>::infinity();
  if (a.size() != b.size())
    return kInf;
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i] == b[i])
      continue; // also equal infinities
    if (!std::isfinite(a[i]) || !std::isfinite(b[i]))
      return kInf;
    worst = std::max(worst, std::abs(a[i] - b[i]));
  }
  return worst;
}

// ---------------------------------------------------------------------------------------------
// Paged KV

PagedKv make_paged_kv(const Problem &problem, std::span<const float> k, std::span<const float> v, int page_size,
                      uint64_t seed, PageGarbage garbage) {
  constexpr int kSpareFraction = 4; // a quarter more pages than needed, never fewer than one spare
  constexpr float kGarbageBase = 64.0f, kGarbageStep = 8.0f;
  constexpr int kGarbageSteps = 8; // 64..120 in steps of 8: exact in fp16 and bf16
  problem.validate();
  require(page_size >= 1, "page_size must be >= 1");
  require_size(k, problem.k_size(), "k");
  require_size(v, problem.v_size(), "v");

  PagedKv paged;
  paged.page_size = page_size;
  paged.heads_kv = problem.heads_kv;
  paged.head_dim_qk = problem.head_dim_qk;
  paged.head_dim_v = problem.head_dim_v;
  paged.seqlens_k = problem.seqlens_k;
  std::vector<int> pages_per_seq(problem.batch);
  int used = 0;
  for (int b = 0; b < problem.batch; ++b) {
    pages_per_seq[b] = (problem.seqlens_k[b] + page_size - 1) / page_size;
    used += pages_per_seq[b];
    paged.max_pages_per_seq = std::max(paged.max_pages_per_seq, pages_per_seq[b]);
  }
  paged.max_pages_per_seq = std::max(paged.max_pages_per_seq, 1); // keep the table non-empty
  paged.num_pages = used + 1 + used / kSpareFraction;

  SplitMix64 rng{seed};
  std::vector<int32_t> order(paged.num_pages);
  std::iota(order.begin(), order.end(), 0);
  for (int i = paged.num_pages - 1; i > 0; --i) // Fisher-Yates
    std::swap(order[i], order[rng.below(uint64_t(i) + 1)]);
  const int32_t spare_page = order[used];
  paged.block_table.assign(size_t(problem.batch) * paged.max_pages_per_seq, spare_page);
  for (int b = 0, next = 0; b < problem.batch; ++b)
    for (int p = 0; p < pages_per_seq[b]; ++p)
      paged.block_table[size_t(b) * paged.max_pages_per_seq + p] = order[next++];

  auto fill = [&](std::vector<float> &pages, int dim) {
    pages.resize(size_t(paged.num_pages) * page_size * problem.heads_kv * dim);
    for (float &x : pages) {
      if (garbage == PageGarbage::nan) {
        x = std::numeric_limits<float>::quiet_NaN();
      } else {
        const float magnitude = kGarbageBase + kGarbageStep * float(rng.below(kGarbageSteps));
        x = (rng.next() & 1u) ? magnitude : -magnitude;
      }
    }
  };
  fill(paged.k_pages, problem.head_dim_qk);
  fill(paged.v_pages, problem.head_dim_v);

  const auto cu_k = problem.cu_seqlens_k();
  for (int b = 0; b < problem.batch; ++b)
    for (int j = 0; j < problem.seqlens_k[b]; ++j)
      for (int hk = 0; hk < problem.heads_kv; ++hk) {
        const size_t row = size_t(cu_k[b] + j) * problem.heads_kv + hk;
        std::copy_n(&k[row * problem.head_dim_qk], problem.head_dim_qk, &paged.k_pages[paged.k_offset(b, j, hk)]);
        std::copy_n(&v[row * problem.head_dim_v], problem.head_dim_v, &paged.v_pages[paged.v_offset(b, j, hk)]);
      }
  return paged;
}

KvTensors gather_paged(const PagedKv &paged) {
  KvTensors out;
  const int batch = int(paged.seqlens_k.size());
  for (int b = 0; b < batch; ++b)
    for (int j = 0; j < paged.seqlens_k[b]; ++j)
      for (int hk = 0; hk < paged.heads_kv; ++hk) {
        const float *k_row = paged.k_row(b, j, hk);
        const float *v_row = paged.v_row(b, j, hk);
        out.k.insert(out.k.end(), k_row, k_row + paged.head_dim_qk);
        out.v.insert(out.v.end(), v_row, v_row + paged.head_dim_v);
      }
  return out;
}

} // namespace flashjit::ref
