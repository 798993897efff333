// Tensor-core MMA through mma.sync (sm_80+), the warp-wide m16n8k16 shape with f32 accumulators.
//
// Fragment layout (g = lane / 4, t = lane % 4), each 32-bit register two 16-bit values:
//   A 16x16 row-major: a0 (g, 2t..2t+1)  a1 (g+8, 2t..)  a2 (g, 2t+8..)  a3 (g+8, 2t+8..)
//   B 16x8 (k x n):    b0 (k 2t..2t+1, n g)  b1 (k 2t+8.., n g)
//   C 16x8 f32:        c0,c1 (g, 2t..2t+1)   c2,c3 (g+8, 2t..2t+1)
#pragma once

#include "prim/types.cuh"

namespace fj {

// The m16n8k16 shape: rows of A and C, columns of B and C, and the reduction.
constexpr int kMmaM = 16;
constexpr int kMmaN = 8;
constexpr int kMmaK = 16;

// mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 d, a, b, c — in place: acc += A * B.
__device__ __forceinline__ void mma_m16n8k16_f16_f32(float (&acc)[4], const u32 (&a)[4], const u32 (&b)[2]) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
               "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
               : "+f"(acc[0]), "+f"(acc[1]), "+f"(acc[2]), "+f"(acc[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 d, a, b, c — in place: acc += A * B.
__device__ __forceinline__ void mma_m16n8k16_bf16_f32(float (&acc)[4], const u32 (&a)[4], const u32 (&b)[2]) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
               "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
               : "+f"(acc[0]), "+f"(acc[1]), "+f"(acc[2]), "+f"(acc[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// dtype-generic form, selected by KernelConfig::kDType.
template <int DType>
__device__ __forceinline__ void mma_m16n8k16(float (&acc)[4], const u32 (&a)[4], const u32 (&b)[2]) {
  if constexpr (DType == kDTypeBf16)
    mma_m16n8k16_bf16_f32(acc, a, b);
  else
    mma_m16n8k16_f16_f32(acc, a, b);
}

} // namespace fj
