// 2^x on the FMA/ALU pipes, shared by the fa3 template (kernels/fa3/softmax.cuh exp2_poly3) and the
// MLIR generator (compiler/mlir/gen_fa3.cpp), so both backends evaluate the same polynomial.
// x = j + f with j = round(x), f in [-0.5, 0.5]; 2^f by a degree-3 minimax polynomial (relative
// error 7.5e-5, below a 16-bit P's rounding), evaluated as ((c3 f + c2) f + c1) f + c0; 2^j by
// writing j into the float's exponent field. Plain C++ so both compilers read it.
#pragma once

namespace fj_exp2_poly {
constexpr float kMinExponent = -127.0f;    // 2^-127 -> exponent field 0 -> scale 0 (exact)
constexpr float kRoundMagic = 12582912.0f; // 1.5 * 2^23: adding it rounds to an integer
constexpr float kC0 = 0.9999280571937561f;
constexpr float kC1 = 0.6932609677314758f;
constexpr float kC2 = 0.2426111251115799f;
constexpr float kC3 = 0.0551716685295105f;
constexpr int kMantissaBits = 23;
constexpr int kExponentBias = 127;
} // namespace fj_exp2_poly
