// GPU check of the MLIR-built combine kernel against a float64 reference and against the NVRTC-built
// kernel of the same spec (cubins from scripts/make-mlir-parity.sh, carried in build-device/). Run by
// scripts/gpu-check.sh on the GPU machine, which has no LLVM:
//   g++ -std=c++17 -O2 tests/mlir_parity/check_combine.cpp -I. -I/usr/local/cuda/include -Itemplates -lcuda -o
//   check_combine
//   ./check_combine build-device/mlir-parity/combine.combine.sm90a.v128.bf16.al16 bf16 128 16
// Pass rule (team): max|ours - ref64| <= 2 * max|naive - ref64| + 1e-5, naive = fp32 merge rounded
// to the output dtype. Outputs are NaN-poisoned first; every element is checked; some states have
// LSE = -inf with NaN in O (must weigh 0) and some rows have no state at all (O = 0, LSE = -inf).
#include "tests/mlir_parity/driver_check.hpp"

#include "kernel_params.h"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <random>
#include <string>
#include <vector>

int main(int argc, char **argv) {
  if (argc < 5) {
    std::printf("usage: %s <out/base> bf16|fp16 <dv> <align_bytes>\n", argv[0]);
    return 1;
  }
  const std::string base = argv[1];
  const bool bf16 = std::string(argv[2]) == "bf16";
  const int dv = std::atoi(argv[3]), align = std::atoi(argv[4]);
  const int rows = 1000, states = 13;
  const long o_row_stride = align >= 16 ? dv : dv + 1; // element-aligned rows when align = 2
  const float neg_inf = -std::numeric_limits<float>::infinity();

  std::mt19937 rng(1234);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<float> po(size_t(states) * rows * dv), plse(size_t(states) * rows);
  for (auto &x : po)
    x = normal(rng);
  for (int s = 0; s < states; ++s)
    for (int r = 0; r < rows; ++r) {
      float l = 3.f * normal(rng);
      if (r % 7 == 3 && s % 3 == 1)
        l = neg_inf; // empty states inside a row
      if (r % 97 == 5)
        l = neg_inf; // rows that saw no key at all
      plse[size_t(s) * rows + r] = l;
      if (l == neg_inf)
        for (int d = 0; d < dv; ++d)
          po[(size_t(s) * rows + r) * dv + d] = NAN; // must weigh 0
    }

  // float64 reference and the naive fp32 merge rounded to the output dtype
  std::vector<double> ref(size_t(rows) * dv), ref_lse(rows);
  std::vector<float> naive(size_t(rows) * dv);
  for (int r = 0; r < rows; ++r) {
    double m = -INFINITY;
    float mf = neg_inf;
    for (int s = 0; s < states; ++s) {
      m = std::max(m, double(plse[size_t(s) * rows + r]));
      mf = std::max(mf, plse[size_t(s) * rows + r]);
    }
    double sum = 0;
    float sumf = 0;
    if (m != -INFINITY)
      for (int s = 0; s < states; ++s) {
        sum += std::exp(plse[size_t(s) * rows + r] - m);
        sumf += std::exp(plse[size_t(s) * rows + r] - mf);
      }
    ref_lse[r] = m == -INFINITY ? -INFINITY : m + std::log(sum);
    for (int d = 0; d < dv; ++d) {
      double acc = 0;
      float accf = 0;
      for (int s = 0; s < states && m != -INFINITY; ++s) {
        const float l = plse[size_t(s) * rows + r];
        if (l == neg_inf)
          continue;
        acc += std::exp(l - m) / sum * po[(size_t(s) * rows + r) * dv + d];
        accf += std::exp(l - mf) / sumf * po[(size_t(s) * rows + r) * dv + d];
      }
      ref[size_t(r) * dv + d] = acc;
      const uint16_t h = bf16 ? parity::f32_to_bf16(accf) : parity::f32_to_f16(accf);
      naive[size_t(r) * dv + d] = bf16 ? parity::bf16_to_f32(h) : parity::f16_to_f32(h);
    }
  }
  double naive_err = 0;
  for (size_t i = 0; i < ref.size(); ++i)
    naive_err = std::max(naive_err, std::fabs(naive[i] - ref[i]));
  const double tol = 2 * naive_err + 1e-5;

  const int sms = parity::open_device();
  CUdeviceptr d_po, d_lse, d_o, d_olse;
  const size_t o_elems = size_t(rows) * o_row_stride + 8;
  CK(cuMemAlloc(&d_po, po.size() * 4));
  CK(cuMemAlloc(&d_lse, plse.size() * 4));
  CK(cuMemAlloc(&d_o, o_elems * 2 + 16));
  CK(cuMemAlloc(&d_olse, rows * 4));
  CK(cuMemcpyHtoD(d_po, po.data(), po.size() * 4));
  CK(cuMemcpyHtoD(d_lse, plse.data(), plse.size() * 4));

  int failures = 0;
  std::vector<std::vector<uint16_t>> outputs;
  for (const char *which : {"mlir", "nvrtc"}) {
    std::vector<char> cubin = parity::read_file(base + "." + which + ".cubin");
    if (cubin.empty()) {
      std::printf("%s: no cubin at %s.%s.cubin\n", which, base.c_str(), which);
      return 1;
    }
    CUmodule mod;
    CK(cuModuleLoadData(&mod, cubin.data()));
    CUfunction fn;
    CK(cuModuleGetFunction(&fn, mod, "fj_combine"));
    CK(cuMemsetD16(d_o, 0x7fff, o_elems)); // NaN poison in both dtypes
    CK(cuMemsetD32(d_olse, 0x7fc00000, rows));
    // element-aligned rows start at an odd element: offset the base by one element as well
    const CUdeviceptr o_base = align >= 16 ? d_o : d_o + 2;
    fj_combine_params p{};
    p.partial_o = reinterpret_cast<const float *>(d_po);
    p.partial_lse = reinterpret_cast<const float *>(d_lse);
    p.state_stride_o = long(rows) * dv;
    p.state_stride_lse = rows;
    p.o = reinterpret_cast<void *>(o_base);
    p.o_row_stride = o_row_stride;
    p.maybe_lse = reinterpret_cast<float *>(d_olse);
    p.num_states = states;
    p.rows = rows;
    p.head_dim_v = dv;
    void *args[] = {&p};
    const int threads = 128, grid = sms * 2;
    CK(cuLaunchKernel(fn, grid, 1, 1, threads, 1, 1, 0, nullptr, args, nullptr));
    CK(cuCtxSynchronize());
    std::vector<uint16_t> out(o_elems);
    std::vector<float> olse(rows);
    CK(cuMemcpyDtoH(out.data(), o_base, (o_elems - 1) * 2));
    CK(cuMemcpyDtoH(olse.data(), d_olse, rows * 4));
    double err = 0, lse_err = 0;
    long bad = 0;
    for (int r = 0; r < rows; ++r) {
      for (int d = 0; d < dv; ++d) {
        const uint16_t h = out[size_t(r) * o_row_stride + d];
        const double v = bf16 ? parity::bf16_to_f32(h) : parity::f16_to_f32(h);
        const double e = std::fabs(v - ref[size_t(r) * dv + d]);
        if (!(e <= tol))
          ++bad;
        err = std::max(err, std::isnan(e) ? INFINITY : e);
      }
      const double le =
          ref_lse[r] == -INFINITY ? (olse[r] == -INFINITY ? 0 : INFINITY) : std::fabs(olse[r] - ref_lse[r]);
      lse_err = std::max(lse_err, std::isnan(le) ? INFINITY : le);
    }
    const bool pass = bad == 0 && lse_err <= 1e-4;
    failures += !pass;
    std::printf("%-6s max|o - ref64| %.3g (tol %.3g, naive %.3g), bad %ld, max|lse - ref64| %.3g: %s\n", which, err,
                tol, naive_err, bad, lse_err, pass ? "PASS" : "FAIL");
    std::vector<uint16_t> o_rows;
    for (int r = 0; r < rows; ++r)
      o_rows.insert(o_rows.end(), out.begin() + size_t(r) * o_row_stride, out.begin() + size_t(r) * o_row_stride + dv);
    outputs.push_back(o_rows);
    CK(cuModuleUnload(mod));
  }
  long differ = 0;
  for (size_t i = 0; i < outputs[0].size(); ++i)
    differ += outputs[0][i] != outputs[1][i];
  std::printf("mlir vs nvrtc: %ld of %zu outputs differ in bits (contraction order may differ by 1 ulp)\n", differ,
              outputs[0].size());
  return failures ? 1 : 0;
}
