// Host time of one cuLaunchKernelEx by kernel property, to attribute the fa3 path's launch cost
// (parameter block size, cluster attribute, dynamic shared memory, block size). Same method as
// flashjit_host_bench: bursts of 32 launches timed on the host clock, the GPU drained between
// bursts; median of the bursts. Build and run on the GPU machine:
//   nvcc -std=c++17 -O2 -arch=sm_90a launch_cost.cu -lcuda -o launch_cost && ./launch_cost
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

template <int kBytes> struct Block { alignas(64) unsigned char bytes[kBytes]; };

// Touches one parameter byte so the block is live; writes nothing unless the byte is odd (never).
template <int kBytes> __global__ void sink(const __grid_constant__ Block<kBytes> block, int *out) {
  if (block.bytes[kBytes - 1] & 1)
    out[threadIdx.x] = 1;
}

constexpr int kBurst = 32;
constexpr int kBursts = 400;

struct Config {
  const char *what;
  unsigned threads = 128, smem = 0, cluster = 1;
};

template <int kBytes> double median_us(const Config &c) {
  Block<kBytes> block{};
  int *out = nullptr;
  cudaMalloc(&out, 4096);
  auto fn = sink<kBytes>;
  if (c.smem > 48 * 1024)
    cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, c.smem);
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(2 * c.cluster);
  config.blockDim = dim3(c.threads);
  config.dynamicSmemBytes = c.smem;
  cudaLaunchAttribute attribute[1];
  if (c.cluster > 1) {
    attribute[0].id = cudaLaunchAttributeClusterDimension;
    attribute[0].val.clusterDim.x = c.cluster;
    attribute[0].val.clusterDim.y = 1;
    attribute[0].val.clusterDim.z = 1;
    config.attrs = attribute;
    config.numAttrs = 1;
  }
  std::vector<double> samples;
  for (int b = 0; b < kBursts; ++b) {
    cudaDeviceSynchronize();
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < kBurst; ++i)
      if (cudaLaunchKernelEx(&config, fn, block, out) != cudaSuccess) {
        std::printf("%s: launch failed: %s\n", c.what, cudaGetErrorString(cudaGetLastError()));
        return -1;
      }
    const std::chrono::duration<double, std::micro> elapsed = std::chrono::steady_clock::now() - start;
    samples.push_back(elapsed.count() / kBurst);
  }
  cudaDeviceSynchronize();
  cudaFree(out);
  std::sort(samples.begin(), samples.end());
  return samples[samples.size() / 2];
}

template <int kBytes> void row(const Config &c) {
  median_us<kBytes>(c); // warm-up: first launches load the module
  std::printf("%-40s params %5d B  threads %4u  smem %6u  cluster %u : %.2f us\n", c.what, kBytes, c.threads, c.smem,
              c.cluster, median_us<kBytes>(c));
}

int main() {
  cudaFree(nullptr);
  for (int round = 0; round < 2; ++round) {
    row<64>({"params 64"});
    row<256>({"params 256"});
    row<512>({"params 512"});
    row<896>({"params 896 (fa3)"});
    row<1536>({"params 1536"});
    row<256>({"params 256, 512 threads", 512});
    row<256>({"params 256, 181 KB smem", 128, 181376});
    row<256>({"params 256, cluster 2", 128, 0, 2});
    row<896>({"fa3-like: 896 B, 512 thr, 181 KB", 512, 181376});
    row<896>({"fa3-like + cluster 2", 384, 200000, 2});
  }
  return 0;
}
