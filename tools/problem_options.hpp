// Command-line description of one attention problem, shared by check, bench and explain.
#pragma once

#include "tests/harness/device_case.hpp"

#include <CLI/CLI.hpp>

#include <string>
#include <vector>

namespace flashjit::cli {

struct ProblemOptions {
  int batch = 2;
  int seqlen_q = 1000;
  int seqlen_k = 0; // 0: same as seqlen_q
  int heads_q = 16;
  int heads_kv = 0; // 0: same as heads_q
  int head_dim = 128;
  int head_dim_v = 0; // 0: same as head_dim
  std::string dtype = "bf16";
  bool causal = false;
  std::vector<int> window; // left,right
  float softcap = 0;
  float scale = 0;
  std::vector<int> varlen_q; // per-sequence lengths (varlen)
  std::vector<int> varlen_k;
  int page_size = 0;
  int row_padding = 0;
  bool head_major = false;
  uint64_t seed = 1;
  std::string variant = "auto";
  bool strict = false;

  void add_to(CLI::App &app);
  // Runtime options these flags select (variant, strict).
  Options runtime_options() const;
  // The harness case, or a message saying which option is inconsistent.
  bool to_case(harness::CaseOptions *out, std::string *error) const;
};

} // namespace flashjit::cli
