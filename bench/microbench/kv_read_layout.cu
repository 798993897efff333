// Microbenchmark (docs/perf-notes.md, session 23): does the K/V layout bound decode 64 x 4096?
// The decode row reads K and V as [batch, kv_len, heads_kv, head_dim] (the layout compare.py and
// PyTorch use): one (sequence, KV head) unit reads a 256-byte row out of every 2 KB, and the eight
// units of a sequence run on different SMs at different times. This kernel reads exactly the
// decode row's bytes (64 sequences x 8 KV heads x 4096 keys x 128 dims, bf16, K and V), one CTA
// per unit as the decode kernel runs it, in that interleaved layout and in the unit-contiguous one
// ([batch, heads_kv, kv_len, head_dim]); and, as the bound of a read of this size, the same bytes
// as one grid-strided stream. Median of 20 timed launches over two copies of the buffers (2.1 GB,
// far past L2). Not part of the build; on the GPU machine:
//   nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -Itemplates bench/microbench/kv_read_layout.cu -o
//   kv_read_layout
#include "microbench.cuh"
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cuda_runtime.h>
#include <vector>

constexpr int kBatch = 64;
constexpr int kHeadsKV = 8;
constexpr int kKeys = 4096;
constexpr int kRowBytes = 128 * 2; // one head's key or value: 128 bf16
constexpr int kVectorBytes = 16;   // one ld.global.nc.v4.u32
constexpr int kVectorsPerRow = kRowBytes / kVectorBytes;
constexpr size_t kTensorBytes = size_t(kBatch) * kHeadsKV * kKeys * kRowBytes; // K or V: 537 MB
constexpr int kCopies = 2;
constexpr int kUnroll = 4;
constexpr int kWarmups = 3;
constexpr int kTimed = 20;

enum class Layout { interleaved_heads, unit_contiguous };

// Byte offset of row `key` of unit (sequence, head).
template <Layout L> __device__ size_t row_offset(int sequence, int head, int key) {
  if constexpr (L == Layout::interleaved_heads)
    return ((size_t(sequence) * kKeys + key) * kHeadsKV + head) * kRowBytes;
  else
    return ((size_t(sequence) * kHeadsKV + head) * kKeys + key) * kRowBytes;
}

// One CTA per (sequence, KV head, key split), heads fastest in the grid as the decode kernel orders
// its units; it reads its keys' K and V rows.
template <Layout L> __global__ void read_units(const char *k, const char *v, int splits, unsigned *sink) {
  const int unit = blockIdx.x / splits, split = blockIdx.x % splits;
  const int head = unit % kHeadsKV, sequence = unit / kHeadsKV;
  const int keys_per_split = kKeys / splits;
  const int rows_per_step = blockDim.x / kVectorsPerRow;
  const int lane_vector = threadIdx.x % kVectorsPerRow;
  unsigned fold = 0;
  const int first = split * keys_per_split + threadIdx.x / kVectorsPerRow;
  const int end = (split + 1) * keys_per_split;
  for (int key = first; key < end; key += kUnroll * rows_per_step) {
    uint4 kv[2 * kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const size_t at = row_offset<L>(sequence, head, key + u * rows_per_step) + lane_vector * kVectorBytes;
      kv[2 * u] = ld_global_nc_v4(k + at);
      kv[2 * u + 1] = ld_global_nc_v4(v + at);
    }
#pragma unroll
    for (int u = 0; u < 2 * kUnroll; ++u)
      fold ^= kv[u].x ^ kv[u].y ^ kv[u].z ^ kv[u].w;
  }
  if (fold == 0x9e3779b9u) // practically never: keeps the loads alive
    sink[0] = fold;
}

// The same bytes as two grid-strided streams (K, then V's vectors at the same index).
__global__ void read_streams(const uint4 *k, const uint4 *v, size_t vectors, unsigned *sink) {
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  unsigned fold = 0;
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < vectors; i += stride) {
    const uint4 a = ld_global_nc_v4(k + i), b = ld_global_nc_v4(v + i);
    fold ^= a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w;
  }
  if (fold == 0x9e3779b9u)
    sink[0] = fold;
}

template <class Launch> double median_tbps(Launch launch) {
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  for (int i = 0; i < kWarmups; ++i)
    launch(i % kCopies);
  std::vector<float> ms(kTimed);
  for (int i = 0; i < kTimed; ++i) {
    cudaEventRecord(start);
    launch(i % kCopies);
    cudaEventRecord(stop);
    cudaEventSynchronize(stop);
    cudaEventElapsedTime(&ms[i], start, stop);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::nth_element(ms.begin(), ms.begin() + kTimed / 2, ms.end());
  return 2.0 * kTensorBytes / (ms[kTimed / 2] * 1e-3) / 1e12;
}

int main() {
  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  char *k[kCopies], *v[kCopies];
  unsigned *sink = nullptr;
  for (int c = 0; c < kCopies; ++c) {
    CHECK(cudaMalloc(&k[c], kTensorBytes));
    CHECK(cudaMalloc(&v[c], kTensorBytes));
    CHECK(cudaMemset(k[c], 0x5a, kTensorBytes));
    CHECK(cudaMemset(v[c], 0xa5, kTensorBytes));
  }
  CHECK(cudaMalloc(&sink, sizeof(unsigned)));
  std::printf("%d SMs; %d x %d keys x %d KV heads x 128 dims bf16, K+V = %.2f GB per launch\n", sms, kBatch, kKeys,
              kHeadsKV, 2.0 * kTensorBytes / 1e9);
  std::printf("%-18s %6s %7s  TB/s (median of %d)\n", "layout", "splits", "threads", kTimed);
  const int units = kBatch * kHeadsKV;
  for (int threads : {256, 512})
    for (int splits : {1, 2, 4}) {
      const int grid = units * splits;
      const double interleaved = median_tbps(
          [&](int c) { read_units<Layout::interleaved_heads><<<grid, threads>>>(k[c], v[c], splits, sink); });
      const double contiguous =
          median_tbps([&](int c) { read_units<Layout::unit_contiguous><<<grid, threads>>>(k[c], v[c], splits, sink); });
      CHECK(cudaGetLastError());
      std::printf("%-18s %6d %7d  %.3f\n%-18s %6d %7d  %.3f\n", "[B,S,Hkv,D]", splits, threads, interleaved,
                  "[B,Hkv,S,D]", splits, threads, contiguous);
    }
  for (int ctas_per_sm : {2, 4}) {
    const double streams = median_tbps([&](int c) {
      read_streams<<<sms * ctas_per_sm, 512>>>(reinterpret_cast<const uint4 *>(k[c]),
                                               reinterpret_cast<const uint4 *>(v[c]), kTensorBytes / kVectorBytes,
                                               sink);
    });
    CHECK(cudaGetLastError());
    std::printf("%-18s %6s %7d  %.3f  (grid-strided, %d CTAs per SM)\n", "one stream", "-", 512, streams, ctas_per_sm);
  }
  return 0;
}
