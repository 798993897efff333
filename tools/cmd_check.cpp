// `flashjit check` and `flashjit bench`: one problem on the GPU.
#include "tools/commands.hpp"
#include "tools/problem_options.hpp"

#include <fstream>
#include <iostream>
#include <memory>

namespace flashjit::cli {
namespace {

struct GpuCommandOptions {
  ProblemOptions problem;
  int iterations = 30;
  bool fa3_model = false; // check: the CPU model of an fa3 kernel's arithmetic beside its result
  std::string timeline;   // bench: where the last launch's fa3 timeline goes (a `.tl` kernel)
};

// Opens device 0 and builds the case, printing why not on failure.
bool open_case(const GpuCommandOptions &o, harness::DeviceSession *session, harness::CaseOptions *c) {
  std::string error;
  if (!o.problem.to_case(c, &error)) {
    std::cerr << "flashjit: " << error << "\n";
    return false;
  }
  if (Status s = session->open(0); !s) {
    std::cerr << "flashjit: no GPU: " << s.message << "\n";
    return false;
  }
  return true;
}

} // namespace

Action add_check(CLI::App &app) {
  auto options = std::make_shared<GpuCommandOptions>();
  options->problem.add_to(app);
  app.add_flag("--fa3-model", options->fa3_model,
               "fa3 kernels: also check the CPU model of the kernel's rounding (tests/reference/fa3_numerics); its "
               "max error should be the kernel's to an ulp");
  return [options] {
    harness::DeviceSession session;
    harness::CaseOptions c;
    if (!open_case(*options, &session, &c))
      return 2;
    c.fa3_model = options->fa3_model;
    Runtime runtime(options->problem.runtime_options());
    const harness::CaseResult result = harness::run_case(runtime, c);
    std::cout << "device: " << session.name() << "\nproblem: " << c.problem.describe() << " "
              << ref::dtype_name(c.dtype) << (c.page_size ? " page " + std::to_string(c.page_size) : "") << "\n"
              << result.summary() << "\n";
    return result.pass() ? 0 : 1;
  };
}

Action add_bench(CLI::App &app) {
  auto options = std::make_shared<GpuCommandOptions>();
  options->problem.seqlen_q = 4096;
  options->problem.batch = 4;
  options->problem.add_to(app);
  app.add_option("--iterations,-n", options->iterations, "timed launches (median reported)")->capture_default_str();
  app.add_option("--timeline", options->timeline,
                 "write the last launch's fa3 timeline (raw, for bench/timeline.py) to this file; needs a kernel built "
                 "with FLASHJIT_FA3_TUNING=timeline=1");
  return [options] {
    harness::DeviceSession session;
    harness::CaseOptions c;
    if (!open_case(*options, &session, &c))
      return 2;
    Runtime runtime(options->problem.runtime_options());
    const harness::BenchResult result = harness::bench_case(
        runtime, c, options->iterations, options->timeline.empty() ? "" : harness::kFa3TimelineSymbol);
    if (!result.status) {
      std::cerr << "flashjit: " << result.status.message << "\n";
      return 1;
    }
    if (!options->timeline.empty()) {
      std::ofstream file(options->timeline, std::ios::binary);
      file.write(reinterpret_cast<const char *>(result.global.data()),
                 static_cast<std::streamsize>(result.global.size()));
      if (!file) {
        std::cerr << "flashjit: could not write " << options->timeline << "\n";
        return 1;
      }
    }
    std::cout << "device: " << session.name() << "\nkernel: " << result.kernel << "\nproblem: " << c.problem.describe()
              << "\nmedian " << result.median_ms << " ms over " << options->iterations << " launches, " << result.tflops
              << " TFLOP/s\n";
    return 0;
  };
}

} // namespace flashjit::cli
