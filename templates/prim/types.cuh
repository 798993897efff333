// Scalar types for device templates, and 16-bit float storage as raw bits.
// NVRTC sees no toolkit header (no <cstdint>, no cuda_fp16.h), so fixed-width names are defined
// here and fp16/bf16 values travel as `u16` bits, converted with PTX `cvt`.
#pragma once

namespace fj {

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;
typedef int i32;
typedef long long i64;

// KernelConfig::kDType values.
enum : int { kDTypeFp16 = 0, kDTypeBf16 = 1 };

// Two floats, without depending on the toolkit's float2.
struct f32x2 {
  float x, y;
};

// One 16-byte vector (a cp.async chunk, eight 16-bit values), for plain vector loads and stores.
struct alignas(16) u32x4 {
  u32 x, y, z, w;
};

// Bits of a float shifted to the bf16 position: a bf16 is the high half of an f32.
constexpr int kBf16Shift = 16;

// cvt.f32.f16 d, a — exact widening of an fp16 value.
__device__ __forceinline__ float cvt_f32_f16(u16 bits) {
  float out;
  asm("cvt.f32.f16 %0, %1;" : "=f"(out) : "h"(bits));
  return out;
}

// bf16 -> f32 is exact as a 16-bit shift; `cvt.f32.bf16` exists only from sm_90, the shift
// works everywhere (mov.b32 d, {0, bits}).
__device__ __forceinline__ float cvt_f32_bf16(u16 bits) {
  float out;
  asm("mov.b32 %0, {%1, %2};" : "=f"(out) : "h"((u16)0), "h"(bits));
  return out;
}

// cvt.rn.f16.f32 d, a — round to nearest even.
__device__ __forceinline__ u16 cvt_rn_f16_f32(float value) {
  u16 out;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(out) : "f"(value));
  return out;
}

// cvt.rn.bf16.f32 d, a — round to nearest even (sm_80+).
__device__ __forceinline__ u16 cvt_rn_bf16_f32(float value) {
  u16 out;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(out) : "f"(value));
  return out;
}

// cvt.rn.f16x2.f32 d, hi, lo — `lo` lands in the low half (the lower address / column).
__device__ __forceinline__ u32 cvt_rn_f16x2_f32(float lo, float hi) {
  u32 out;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(out) : "f"(hi), "f"(lo));
  return out;
}

// cvt.rn.bf16x2.f32 d, hi, lo — `lo` lands in the low half (sm_80+).
__device__ __forceinline__ u32 cvt_rn_bf16x2_f32(float lo, float hi) {
  u32 out;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(out) : "f"(hi), "f"(lo));
  return out;
}

// dtype-generic forms, selected by KernelConfig::kDType.
template <int DType> __device__ __forceinline__ float to_f32(u16 bits) {
  if constexpr (DType == kDTypeBf16)
    return cvt_f32_bf16(bits);
  else
    return cvt_f32_f16(bits);
}

template <int DType> __device__ __forceinline__ u16 from_f32(float value) {
  if constexpr (DType == kDTypeBf16)
    return cvt_rn_bf16_f32(value);
  else
    return cvt_rn_f16_f32(value);
}

// Packs two floats into one 32-bit register of two 16-bit values, `lo` first in memory.
template <int DType> __device__ __forceinline__ u32 pack2_from_f32(float lo, float hi) {
  if constexpr (DType == kDTypeBf16)
    return cvt_rn_bf16x2_f32(lo, hi);
  else
    return cvt_rn_f16x2_f32(lo, hi);
}

// The nearest 16-bit value to `value` (round to nearest even), as a float.
template <int DType> __device__ __forceinline__ float round_to_16bit(float value) {
  return to_f32<DType>(from_f32<DType>(value));
}

// Unpacks a 32-bit pair of 16-bit values (low half first) into floats.
template <int DType> __device__ __forceinline__ f32x2 unpack2_to_f32(u32 pair) {
  constexpr u32 kLowMask = 0xffffu;
  return {to_f32<DType>((u16)(pair & kLowMask)), to_f32<DType>((u16)(pair >> kBf16Shift))};
}

// cvta.to.shared.u64 — the 32-bit shared-window address that ldmatrix / cp.async / st.shared take.
__device__ __forceinline__ u32 cvta_to_shared_u32(const void *generic) {
  u64 address;
  asm("cvta.to.shared.u64 %0, %1;" : "=l"(address) : "l"(generic));
  return (u32)address;
}

} // namespace fj
