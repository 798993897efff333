// The fa3 parity cases, shared by make_fa3_bundle.cpp (builds their kernels here, with MLIR and with
// NVRTC) and check_fa3.cpp (runs them on the GPU). A case is one kernel spec plus the problem that
// exercises it; `timed` cases are also timed at S = 4096.
#pragma once

#include <vector>

namespace flashjit::parity {

struct Fa3Case {
  const char *label;
  int dqk, dv;
  bool fp16, causal;
  int window_left = -1, window_right = -1; // either >= 0: sliding window (spec.local)
  float softcap = 0;                       // > 0: spec.softcap
  std::vector<int> seqlens_q, seqlens_k;   // several entries: varlen; one: batch mode with `batch`
  int batch = 1;
  int heads_q = 8, heads_kv = 2; // GQA group 4
  bool timed = false;
  bool varlen() const { return seqlens_q.size() > 1; }
  bool local() const { return window_left >= 0 || window_right >= 0; }
};

// The key (and query) length of the timed problem of a `timed` case (tests/mlir_parity/check_fa3.cpp).
constexpr int kTimedSeqlen = 4096;

// Lengths that are not multiples of any tile (kBlockM 128/192, kBlockN 80..224), seqlen_q < seqlen_k
// and seqlen_q > seqlen_k (causal rows and whole tiles that see no key: O = 0, LSE = -inf).
inline std::vector<Fa3Case> fa3_cases() {
  std::vector<Fa3Case> cases;
  cases.push_back({"d64 bf16", 64, 64, false, false, -1, -1, 0, {1000}, {1300}, 2, 8, 2, true});
  cases.push_back({"d80 bf16 causal", 80, 80, false, true, -1, -1, 0, {1500}, {1021}, 1, 8, 2, true});
  cases.push_back({"d128 bf16 causal", 128, 128, false, true, -1, -1, 0, {2049}, {2049}, 1, 4, 1, true});
  cases.push_back({"d128 bf16", 128, 128, false, false, -1, -1, 0, {1000}, {1777}, 1, 8, 2, true});
  cases.push_back({"d72 fp16", 72, 72, true, false, -1, -1, 0, {1111}, {1000}, 1, 8, 2, true});
  cases.push_back({"d192/128 bf16 causal", 192, 128, false, true, -1, -1, 0, {777}, {1777}, 1, 8, 2, true});
  cases.push_back({"d256 fp16", 256, 256, true, false, -1, -1, 0, {1000}, {1000}, 1, 4, 2, false});
  cases.push_back({"d128 bf16 window+softcap", 128, 128, false, false, 200, 0, 30.f, {1000}, {1300}, 1, 8, 2, false});
  cases.push_back({"d64 bf16 causal varlen",
                   64,
                   64,
                   false,
                   true,
                   -1,
                   -1,
                   0,
                   {1, 513, 77, 1000},
                   {300, 600, 77, 1200},
                   4,
                   8,
                   2,
                   false});
  return cases;
}

} // namespace flashjit::parity
