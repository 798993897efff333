// What the host-only MLIR-vs-NVRTC checkers (check_combine, check_decode, check_fa2) share: opening
// the device, a driver call check, 16-bit float conversions and a file reader. They are built with
// plain g++ on the GPU machine (no LLVM, no flashjit library), so this header needs only the C++
// library and cuda.h.
#pragma once

#include <cuda.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#define CK(x)                                                                                                          \
  do {                                                                                                                 \
    CUresult r_ = (x);                                                                                                 \
    if (r_ != CUDA_SUCCESS) {                                                                                          \
      const char *m_ = nullptr;                                                                                        \
      cuGetErrorString(r_, &m_);                                                                                       \
      std::printf("%s:%d %s: %s\n", __FILE__, __LINE__, #x, m_ ? m_ : "?");                                            \
      std::exit(2);                                                                                                    \
    }                                                                                                                  \
  } while (0)

namespace parity {

inline float bf16_to_f32(uint16_t h) {
  uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

inline float f16_to_f32(uint16_t h) {
  const int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
  float v = e == 0 ? std::ldexp(float(m), -24) : e == 31 ? (m ? NAN : INFINITY) : std::ldexp(float(m | 1024), e - 25);
  return s ? -v : v;
}

// Round to nearest even.
inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  u += 0x7fff + ((u >> 16) & 1);
  return uint16_t(u >> 16);
}

// Round to nearest even through double arithmetic; subnormals included, overflow to infinity.
inline uint16_t f32_to_f16(float f) {
  if (std::isnan(f))
    return 0x7e00;
  const int s = std::signbit(f);
  const double a = std::fabs(double(f));
  if (a >= 65520.0)
    return uint16_t((s << 15) | 0x7c00);
  int e;
  std::frexp(a, &e); // a = m * 2^e, m in [0.5, 1)
  int exp = std::max(e - 1, -14);
  double q = std::nearbyint(std::ldexp(a, 10 - exp)); // mantissa with the implicit bit
  if (q >= 2048) {
    q /= 2;
    ++exp;
  }
  const uint16_t bits = q < 1024 ? uint16_t(q) : uint16_t(((exp + 15) << 10) | (uint16_t(q) & 1023));
  return uint16_t((s << 15) | bits);
}

// Makes device 0's primary context current; returns its SM count.
inline int open_device() {
  CK(cuInit(0));
  CUdevice dev;
  CK(cuDeviceGet(&dev, 0));
  CUcontext ctx;
  CK(cuDevicePrimaryCtxRetain(&ctx, dev));
  CK(cuCtxSetCurrent(ctx));
  int sms = 0;
  CK(cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev));
  return sms;
}

inline std::vector<char> read_file(const std::string &path) {
  std::ifstream f(path, std::ios::binary);
  return std::vector<char>((std::istreambuf_iterator<char>(f)), {});
}

} // namespace parity
