// Shared-memory stores (and the one 32-bit load that reads them back) through 32-bit shared-window
// addresses (cvta_to_shared_u32).
#pragma once

#include "prim/types.cuh"

namespace fj {

// st.shared.v4.b32 [a], {b0..b3} — 16 bytes; a must be 16-byte aligned.
__device__ __forceinline__ void st_shared_v4_b32(u32 address, const u32 (&value)[4]) {
  asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(address), "r"(value[0]), "r"(value[1]), "r"(value[2]),
               "r"(value[3])
               : "memory");
}

// st.shared.b32 [a], b — 4 bytes; a must be 4-byte aligned.
__device__ __forceinline__ void st_shared_b32(u32 address, u32 value) {
  asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(address), "r"(value) : "memory");
}

// ld.shared.b32 d, [a] — 4 bytes; a must be 4-byte aligned.
__device__ __forceinline__ u32 ld_shared_b32(u32 address) {
  u32 value;
  asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(value) : "r"(address) : "memory");
  return value;
}

} // namespace fj
