// Fast transcendental functions through their PTX approximations (MUFU).
#pragma once

#include "prim/types.cuh"

namespace fj {

// log2(e) and ln(2): softmax runs in base 2 (exp2 is one MUFU op), the LSE is reported in base e.
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// ex2.approx.ftz.f32 d, a — 2^a; ex2(-inf) = +0, which is how masked logits vanish.
__device__ __forceinline__ float ex2_approx(float x) {
  float out;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(out) : "f"(x));
  return out;
}

// lg2.approx.ftz.f32 d, a — log2(a); lg2(0) = -inf.
__device__ __forceinline__ float lg2_approx(float x) {
  float out;
  asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(out) : "f"(x));
  return out;
}

// tanh.approx.f32 d, a — sm_75+; max relative error about 2^-11, enough for a softcap whose
// output is rounded to 16 bits before P·V anyway.
__device__ __forceinline__ float tanh_approx(float x) {
  float out;
  asm("tanh.approx.f32 %0, %1;" : "=f"(out) : "f"(x));
  return out;
}

// rcp.approx.ftz.f32 d, a — 1/a, for the final normalization of a row.
__device__ __forceinline__ float rcp_approx(float x) {
  float out;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(out) : "f"(x));
  return out;
}

// tanh(x) = 1 - 2 / (2^(2x log2 e) + 1), from ex2.approx (relative error ~2^-22) and a
// reciprocal: the absolute error stays near 1e-7 over the whole range, about 100x below
// tanh.approx.f32, which matters because a softcap multiplies it by the cap (tens) before exp.
__device__ __forceinline__ float tanh_fast(float x) {
  constexpr float kTwoLog2e = 2.0f * kLog2e;
  return 1.0f - 2.0f * rcp_approx(ex2_approx(x * kTwoLog2e) + 1.0f);
}

// fma.rn.f32 d, a, b, c — a * b + c with one rounding; spelled out so that the softmax's folded
// scale is one FFMA whatever the compiler's contraction flags.
__device__ __forceinline__ float fma_rn_f32(float a, float b, float c) {
  float out;
  asm("fma.rn.f32 %0, %1, %2, %3;" : "=f"(out) : "f"(a), "f"(b), "f"(c));
  return out;
}

// max.f32 d, a, b — returns the non-NaN operand when one is NaN; -inf is the identity.
__device__ __forceinline__ float max_f32(float a, float b) {
  float out;
  asm("max.f32 %0, %1, %2;" : "=f"(out) : "f"(a), "f"(b));
  return out;
}

// mad.wide.s32 d, a, b, c — a * b as a 64-bit product, plus the 64-bit c: one IMAD.WIDE, where
// the same sum in 64-bit C++ arithmetic takes four instructions.
__device__ __forceinline__ i64 mad_wide_s32(i32 a, i32 b, i64 c) {
  i64 out;
  asm("mad.wide.s32 %0, %1, %2, %3;" : "=l"(out) : "r"(a), "r"(b), "l"(c));
  return out;
}

// -inf (bit pattern 0xff800000): mov.b32 d, 0fFF800000.
__device__ __forceinline__ float neg_inf() {
  float out;
  asm("mov.b32 %0, 0fFF800000;" : "=f"(out));
  return out;
}

} // namespace fj
