// The exp2 polynomial both fa3 backends evaluate (templates/exp2_poly.h) against exp2 in double: a
// model of the kernel's float operations (FFMA for each Horner step, the round-by-magic split and the
// exponent built in the float's bits) that pins the header's claims, so a mistyped coefficient or
// constant fails here, without a GPU.
#include "exp2_poly.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

namespace {

using namespace fj_exp2_poly;

constexpr double kClaimedRelativeError = 7.5e-5; // the header's figure for 2^f, f in [-0.5, 0.5]
constexpr int kSamples = 200001;

float bits_to_float(int32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

int32_t float_to_bits(float f) {
  int32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  return bits;
}

// 2^f by Horner's rule, one fused multiply-add a step (as ptxas emits FFMA).
float poly(float f) {
  return std::fma(std::fma(std::fma(kC3, f, kC2), f, kC1), f, kC0);
}

// The whole function for x <= 0, as kernels/fa3/softmax.cuh exp2_poly3 computes it.
float exp2_poly3(float x) {
  x = std::max(x, kMinExponent);
  const float rounded = x + kRoundMagic;
  const float f = x - (rounded - kRoundMagic);
  // The low mantissa bits of `rounded` hold j; shifted into the exponent field they give 2^j (the
  // sum wraps to 0 at j = -127: unsigned here, as the device's IADD wraps).
  const uint32_t exponent = (static_cast<uint32_t>(float_to_bits(rounded)) << kMantissaBits) +
                            (static_cast<uint32_t>(kExponentBias) << kMantissaBits);
  return poly(f) * bits_to_float(static_cast<int32_t>(exponent));
}

TEST(Exp2Poly, PolynomialMeetsItsClaimedErrorOnHalfAnOctave) {
  double worst = 0;
  for (int i = 0; i < kSamples; ++i) {
    const float f = static_cast<float>(-0.5 + double(i) / (kSamples - 1));
    const double exact = std::exp2(double(f));
    worst = std::max(worst, std::abs(double(poly(f)) - exact) / exact);
  }
  EXPECT_LE(worst, kClaimedRelativeError);
  EXPECT_GT(worst, kClaimedRelativeError / 4) << "a degree-3 fit cannot be this close: is the claim stale?";
}

TEST(Exp2Poly, WholeFunctionAcrossTheNormalRange) {
  double worst = 0;
  for (int i = 0; i < kSamples; ++i) {
    const float x = static_cast<float>(-126.0 * double(i) / (kSamples - 1));
    const double exact = std::exp2(double(x));
    worst = std::max(worst, std::abs(double(exp2_poly3(x)) - exact) / exact);
  }
  EXPECT_LE(worst, kClaimedRelativeError);
  EXPECT_NEAR(exp2_poly3(0.0f), 1.0f, kClaimedRelativeError);
  EXPECT_NEAR(exp2_poly3(-1.0f), 0.5f, 0.5 * kClaimedRelativeError);
}

TEST(Exp2Poly, BelowTheExponentRangeIsExactlyZero) {
  // A masked or far-below-max logit: -inf and anything under -127 clamp to 2^-127, whose exponent
  // field is 0, so p is exactly 0 and adds nothing to the row sum.
  for (const float x : {-127.0f, -128.5f, -1000.0f, -std::numeric_limits<float>::infinity()})
    EXPECT_EQ(exp2_poly3(x), 0.0f) << x;
}

} // namespace
