// GPU parity check of the MLIR-built fa3 prefill kernel (compiler/mlir/gen_fa3.cpp) against the NVRTC
// build of the same spec and plan, both served through the library's normal launch path: two runtimes,
// JIT off, one with DIR/fa3-mlir.fjb registered and one with DIR/fa3-nvrtc.fjb (both made here by
// scripts/make-mlir-parity-fa3.sh, which also builds this program against build-device's library).
//   build-device/mlir-parity-fa3/check_fa3 build-device/mlir-parity-fa3
// Per case of fa3_cases.hpp: random inputs (never zeros), NaN-poisoned outputs, every element of O and
// LSE checked against the float64 reference under the team rule (max|ours - ref64| <= 2 *
// max|naive - ref64| + 1e-5, tests/harness), for both kernels; then the MLIR-vs-NVRTC difference of O.
// Timed cases: batch 4 x 4096 x 16 heads, median of kIterations launches, TFLOP/s of both and the ratio.
// Exit 0 when every check passes. With --dry-run (no GPU needed): only asks both runtimes whether each
// case's problem is served from its bundle for sm90a (the spec -> kernel name mapping), and prints the origin.
#include "tests/harness/device_case.hpp"
#include "tests/mlir_parity/fa3_cases.hpp"

#include <flashjit/flashjit.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

namespace {

using namespace flashjit;

constexpr int kIterations = 30;
constexpr int kTimedBatch = 4;
using parity::kTimedSeqlen;
constexpr int kTimedHeadsQ = 16;
constexpr uint64_t kSeed = 20261129;

harness::CaseOptions case_options(const parity::Fa3Case &c) {
  harness::CaseOptions o;
  ref::Problem &p = o.problem;
  p.batch = c.varlen() ? static_cast<int>(c.seqlens_q.size()) : c.batch;
  p.seqlens_q = c.varlen() ? c.seqlens_q : std::vector<int>(p.batch, c.seqlens_q.front());
  p.seqlens_k = c.varlen() ? c.seqlens_k : std::vector<int>(p.batch, c.seqlens_k.front());
  p.heads_q = c.heads_q;
  p.heads_kv = c.heads_kv;
  p.head_dim_qk = c.dqk;
  p.head_dim_v = c.dv;
  p.causal = c.causal;
  p.window_left = c.window_left;
  p.window_right = c.window_right;
  p.softcap = c.softcap;
  o.dtype = c.fp16 ? ref::Dtype::fp16 : ref::Dtype::bf16;
  o.varlen = c.varlen();
  o.with_lse = true;
  o.seed = kSeed;
  return o;
}

// The case's problem shape for flashjit_is_served: no data (null pointers count as aligned); varlen
// problems carry a dummy cu_seqlens pointer, never read.
AttentionProblem shape_of(const harness::CaseOptions &o) {
  static const int32_t kDummyOffsets[2] = {0, 0};
  const ref::Problem &p = o.problem;
  AttentionProblem a;
  a.dtype = o.dtype == ref::Dtype::fp16 ? FLASHJIT_FP16 : FLASHJIT_BF16;
  a.batch = p.batch;
  a.seqlen_q = p.max_seqlen_q();
  a.seqlen_k = p.max_seqlen_k();
  a.heads_q = p.heads_q;
  a.heads_kv = p.heads_kv;
  a.head_dim_qk = p.head_dim_qk;
  a.head_dim_v = p.head_dim_v;
  a.causal = p.causal;
  a.window_left = p.window_left;
  a.window_right = p.window_right;
  a.softcap = p.softcap;
  if (o.varlen) {
    a.cu_seqlens_q = kDummyOffsets;
    a.cu_seqlens_k = kDummyOffsets;
    a.total_q = p.total_q();
    a.total_k = p.total_k();
  }
  return a;
}

harness::CaseOptions timed_options(const parity::Fa3Case &c, harness::CaseOptions o) {
  o.problem.batch = kTimedBatch;
  o.problem.seqlens_q.assign(kTimedBatch, kTimedSeqlen);
  o.problem.seqlens_k.assign(kTimedBatch, kTimedSeqlen);
  o.problem.heads_q = kTimedHeadsQ;
  o.problem.heads_kv = kTimedHeadsQ / (c.heads_q / c.heads_kv);
  return o;
}

// --dry-run: is every problem served by both bundles? (No GPU: the arch is named.)
int dry_run(Runtime &mlir, Runtime &nvrtc) {
  int failures = 0;
  for (const parity::Fa3Case &c : parity::fa3_cases())
    for (bool timed : {false, true}) {
      if (timed && !c.timed)
        continue;
      const harness::CaseOptions o = timed ? timed_options(c, case_options(c)) : case_options(c);
      const AttentionProblem a = shape_of(o);
      for (auto [runtime, name] : {std::pair{&mlir, "mlir"}, std::pair{&nvrtc, "nvrtc"}}) {
        bool served = false;
        std::string origin;
        Status s = runtime->is_served(a, "sm90a", &served, &origin);
        failures += !(s.ok() && served);
        std::printf("%-26s %-5s %-5s %s\n", c.label, timed ? "timed" : "", name,
                    s.ok() ? (served ? origin.c_str() : ("NOT SERVED: " + origin).c_str()) : s.message.c_str());
      }
    }
  std::printf("%s (%d not served)\n", failures ? "FAIL" : "every problem is served by both bundles", failures);
  return failures ? 1 : 0;
}

Options bundle_only() {
  Options o;
  o.jit = 0;        // a kernel not in the registered bundle is an error, never a silent NVRTC compile
  o.disk_cache = 0; // nor a cached one
  o.variant = FLASHJIT_VARIANT_FA3;
  o.strict = 1;
  // Plan as the MLIR backend does (single CTAs, eager rescale): both bundles hold that plan.
  o.backend = FLASHJIT_BACKEND_MLIR;
  return o;
}

} // namespace

int main(int argc, char **argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s DIR [--dry-run] (DIR holds fa3-mlir.fjb and fa3-nvrtc.fjb)\n", argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  const bool dry = argc > 2 && std::string(argv[2]) == "--dry-run";
  Runtime mlir(bundle_only()), nvrtc(bundle_only());
  for (auto [runtime, file] : {std::pair{&mlir, "/fa3-mlir.fjb"}, std::pair{&nvrtc, "/fa3-nvrtc.fjb"}})
    if (Status s = runtime->register_bundle(dir + file); !s) {
      std::printf("%s%s: %s\n", dir.c_str(), file, s.message.c_str());
      return 2;
    }
  if (dry)
    return dry_run(mlir, nvrtc);
  harness::DeviceSession session;
  if (Status s = session.open(0); !s) {
    std::printf("no GPU: %s\n", s.message.c_str());
    return 2;
  }
  std::printf("device: %s\n", session.name().c_str());

  int failures = 0;
  for (const parity::Fa3Case &c : parity::fa3_cases()) {
    const harness::CaseOptions o = case_options(c);
    const harness::CaseResult a = harness::run_case(mlir, o);
    const harness::CaseResult b = harness::run_case(nvrtc, o);
    double max_diff = 0;
    size_t identical = 0;
    const size_t n = std::min(a.o_values.size(), b.o_values.size());
    for (size_t i = 0; i < n; ++i) {
      const double d = std::fabs(double(a.o_values[i]) - double(b.o_values[i]));
      if (std::isnan(d))
        max_diff = INFINITY;
      else
        max_diff = std::max(max_diff, d);
      identical += a.o_values[i] == b.o_values[i];
    }
    const bool pass = a.pass() && b.pass() && n > 0 && a.o_values.size() == b.o_values.size();
    failures += !pass;
    std::printf("\n== %s: %s (%s)\n  mlir : %s\n  nvrtc: %s\n  mlir vs nvrtc: max|dO| %.3g, %zu of %zu O elements "
                "identical\n",
                c.label, pass ? "PASS" : "FAIL", a.kernel.c_str(),
                a.status.ok() ? a.summary().c_str() : a.status.message.c_str(),
                b.status.ok() ? b.summary().c_str() : b.status.message.c_str(), max_diff, identical, n);
  }

  std::printf("\n== timing (batch %d x %d tokens x %d heads, median of %d launches)\n", kTimedBatch, kTimedSeqlen,
              kTimedHeadsQ, kIterations);
  for (const parity::Fa3Case &c : parity::fa3_cases()) {
    if (!c.timed)
      continue;
    const harness::CaseOptions o = timed_options(c, case_options(c));
    const harness::BenchResult a = harness::bench_case(mlir, o, kIterations);
    const harness::BenchResult b = harness::bench_case(nvrtc, o, kIterations);
    if (!a.status || !b.status) {
      ++failures;
      std::printf("  %-24s FAIL: %s\n", c.label, (!a.status ? a.status.message : b.status.message).c_str());
      continue;
    }
    std::printf("  %-24s mlir %7.1f TFLOP/s  nvrtc %7.1f TFLOP/s  mlir/nvrtc %.3f  (%s)\n", c.label, a.tflops, b.tflops,
                a.tflops / b.tflops, a.kernel.c_str());
  }
  std::printf("\n%s (%d failures)\n", failures ? "FAIL" : "ALL PASS", failures);
  return failures ? 1 : 0;
}
