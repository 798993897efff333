// Shared-memory stores through 32-bit shared-window addresses (cvta_to_shared_u32).
#pragma once

#include "prim/types.cuh"

namespace fj {

// st.shared.v4.b32 [a], {b0..b3} — 16 bytes; a must be 16-byte aligned.
__device__ __forceinline__ void st_shared_v4_b32(u32 address, const u32 (&value)[4]) {
  asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(address), "r"(value[0]), "r"(value[1]), "r"(value[2]),
               "r"(value[3])
               : "memory");
}

} // namespace fj
