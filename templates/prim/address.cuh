// Byte addresses of rows in strided tensors: 32-bit strides where they fit (one IMAD.WIDE a row,
// mad_wide_s32), 64-bit ones otherwise.
#pragma once

#include "prim/math.cuh"
#include "prim/types.cuh"

namespace fj {

// `base` moved by `count` strides of `bytes`: one IMAD.WIDE (mad_wide_s32) for 32-bit strides; the
// i64 overload is for strides that do not fit 32 bits.
__device__ __forceinline__ const u8 *advance_bytes(const u8 *base, i32 count, i32 bytes) {
  return reinterpret_cast<const u8 *>(mad_wide_s32(count, bytes, reinterpret_cast<i64>(base)));
}
__device__ __forceinline__ const u8 *advance_bytes(const u8 *base, i32 count, i64 bytes) {
  return base + count * bytes;
}

// `base` moved to row `slot` of a paged tensor, `page` being its block-table entry: by the page, then the row in it.
// `base` by reference: by value, NVVM merges the two 64-bit offsets before inlining (fa2's kernels then changed).
template <int PageRows, class Stride>
__device__ __forceinline__ const u8 *advance_to_paged_row(const u8 *const &base, i32 page, u32 slot, Stride page_bytes,
                                                          Stride row_bytes) {
  const u8 *page_start = advance_bytes(base, page, page_bytes);
  if constexpr (PageRows > 1)
    return advance_bytes(page_start, static_cast<i32>(slot % PageRows), row_bytes);
  return page_start;
}

// Whether a 64-bit value fits a 32-bit signed one (strides for advance_bytes' fast form).
__device__ __forceinline__ bool fits_i32(i64 value) {
  return static_cast<i32>(value) == value;
}

} // namespace fj
