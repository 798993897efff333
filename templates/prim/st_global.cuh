// Global-memory stores: 16-byte vectors for aligned rows, scalars for the element-aligned path.
#pragma once

#include "prim/types.cuh"

namespace fj {

// st.global.v4.b32 [a], {b0..b3} — 16 bytes (eight 16-bit values); a must be 16-byte aligned.
__device__ __forceinline__ void st_global_v4_b32(void *address, const u32 (&value)[4]) {
  asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(address), "r"(value[0]), "r"(value[1]), "r"(value[2]),
               "r"(value[3])
               : "memory");
}

// st.global.v2.b32 [a], {b0, b1} — 8 bytes (four 16-bit values); a must be 8-byte aligned.
__device__ __forceinline__ void st_global_v2_b32(void *address, const u32 (&value)[2]) {
  asm volatile("st.global.v2.b32 [%0], {%1, %2};" ::"l"(address), "r"(value[0]), "r"(value[1]) : "memory");
}

// st.global.v4.f32 [a], {b0..b3} — a must be 16-byte aligned.
__device__ __forceinline__ void st_global_v4_f32(float *address, const float (&value)[4]) {
  asm volatile("st.global.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(address), "f"(value[0]), "f"(value[1]), "f"(value[2]),
               "f"(value[3])
               : "memory");
}

// st.global.f32 [a], b
__device__ __forceinline__ void st_global_f32(float *address, float value) {
  asm volatile("st.global.f32 [%0], %1;" ::"l"(address), "f"(value) : "memory");
}

// st.global.b16 [a], b
__device__ __forceinline__ void st_global_b16(void *address, u16 value) {
  asm volatile("st.global.b16 [%0], %1;" ::"l"(address), "h"(value) : "memory");
}

} // namespace fj
