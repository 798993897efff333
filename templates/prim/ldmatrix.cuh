// Shared memory -> mma.sync fragments (sm_75+). Each 8x8 matrix of 16-bit values is addressed by
// 8 row pointers (16 bytes each); lanes 8i..8i+7 supply the rows of matrix i. Lane l receives
// (row l/4, columns 2(l%4), 2(l%4)+1) of every matrix, or its transpose with `.trans`.
#pragma once

#include "prim/types.cuh"

namespace fj {

// ldmatrix.sync.aligned.m8n8.x4.shared.b16 {d0..d3}, [addr]
__device__ __forceinline__ void ldmatrix_x4(u32 (&out)[4], u32 smem_addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(out[0]), "=r"(out[1]), "=r"(out[2]), "=r"(out[3])
               : "r"(smem_addr));
}

// ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {d0..d3}, [addr]
__device__ __forceinline__ void ldmatrix_x4_trans(u32 (&out)[4], u32 smem_addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(out[0]), "=r"(out[1]), "=r"(out[2]), "=r"(out[3])
               : "r"(smem_addr));
}

// ldmatrix.sync.aligned.m8n8.x2.shared.b16 {d0, d1}, [addr] — lanes 0..15 supply addresses.
__device__ __forceinline__ void ldmatrix_x2(u32 (&out)[2], u32 smem_addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];"
               : "=r"(out[0]), "=r"(out[1])
               : "r"(smem_addr));
}

// ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {d0, d1}, [addr] — lanes 0..15 supply addresses.
__device__ __forceinline__ void ldmatrix_x2_trans(u32 (&out)[2], u32 smem_addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];"
               : "=r"(out[0]), "=r"(out[1])
               : "r"(smem_addr));
}

} // namespace fj
