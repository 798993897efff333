// Builds the kernels of the fa3 parity cases (fa3_cases.hpp) twice, here where LLVM/MLIR and the CUDA
// toolkit are: with the MLIR backend (PTX from mlirgen::generate, assembled by ptxas in whole-program
// mode, as NVRTC assembles its own) and with NVRTC, into two single-file bundles the GPU machine's
// runtime serves with JIT off (FLASHJIT_BUNDLE_PATH / flashjit_register_bundle). Prints each MLIR
// kernel's cold compile (build IR, lower, PTX, ptxas) next to NVRTC's, and registers / spills of both.
//   make_fa3_bundle OUT_DIR [PTXAS]     (writes OUT_DIR/fa3-mlir.fjb and OUT_DIR/fa3-nvrtc.fjb)
// Why not the backend's nvJitLink cubin: nvJitLink assembles PTX as a relocatable unit, where ptxas
// ignores setmaxnreg (C7504) and the fa3 kernel spills, whichever compiler wrote the PTX.
#include "compiler/build.hpp"
#include "compiler/compiled_kernel.hpp"
#include "compiler/mlir/mlir_backend.hpp"
#include "compiler/planner.hpp"
#include "runtime/bundle.hpp"
#include "tests/mlir_parity/fa3_cases.hpp"

#include <array>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <string>

namespace {

using namespace flashjit;

// The spec of a case with `seqlen_k` keys: the key block is the runtime's choice for that length.
KernelSpec spec_of(const parity::Fa3Case &c, int seqlen_k) {
  KernelSpec spec;
  spec.arch = Arch{90, true};
  spec.head_dim_qk = c.dqk;
  spec.head_dim_v = c.dv;
  spec.dtype = c.fp16 ? FLASHJIT_FP16 : FLASHJIT_BF16;
  spec.causal = c.causal;
  spec.local = c.local();
  spec.softcap = c.softcap > 0;
  spec.varlen = c.varlen();
  if (!spec.varlen)
    spec.key_block = fa3_key_block_for(spec, c.seqlens_q.front(), seqlen_k, FLASHJIT_BACKEND_MLIR);
  return spec;
}

// ptxas -arch=sm_90a -v on `ptx` (whole program); the cubin into *cubin, the log returned.
std::string assemble(const std::string &ptxas, const std::filesystem::path &dir, const std::string &name,
                     const std::string &ptx, std::vector<char> *cubin) {
  const std::filesystem::path in = dir / (name + ".ptx"), out = dir / (name + ".cubin");
  std::ofstream(in) << ptx;
  const std::string command = ptxas + " -arch=sm_90a -v -warn-spills " + in.string() + " -o " + out.string() + " 2>&1";
  std::string log;
  if (FILE *pipe = popen(command.c_str(), "r")) {
    std::array<char, 4096> buffer;
    size_t n;
    while ((n = fread(buffer.data(), 1, buffer.size(), pipe)) > 0)
      log.append(buffer.data(), n);
    if (pclose(pipe) != 0)
      return log + "\nptxas failed";
  }
  std::ifstream f(out, std::ios::binary);
  cubin->assign(std::istreambuf_iterator<char>(f), {});
  return log;
}

} // namespace

int main(int argc, char **argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s OUT_DIR [PTXAS]\n", argv[0]);
    return 2;
  }
  const std::filesystem::path out_dir = argv[1];
  const std::string ptxas = argc > 2 ? argv[2] : "/usr/local/cuda/bin/ptxas";
  const std::filesystem::path work = out_dir / "ptx";
  std::filesystem::create_directories(work);
  BundleContents mlir_bundle, nvrtc_bundle;
  std::set<std::string> names;
  int failures = 0;
  std::printf("%-46s | MLIR build/lower/PTX/ptxas ms | regs spill | NVRTC ms | regs spill\n", "kernel");
  // Every case at its own key length and, if timed, at the timed problem's.
  std::vector<std::pair<const char *, KernelSpec>> specs;
  for (const parity::Fa3Case &c : parity::fa3_cases()) {
    specs.emplace_back(c.label, spec_of(c, c.seqlens_k.front()));
    if (c.timed)
      specs.emplace_back(c.label, spec_of(c, parity::kTimedSeqlen));
  }
  for (const auto &[label, spec] : specs) {
    // The plan the MLIR backend renders (single-CTA tiles); NVRTC builds the same plan beside it.
    const PlanChoice choice = choose_plan(spec, Variant::fa3, FLASHJIT_BACKEND_MLIR);
    if (!choice.ok) {
      std::printf("%s: no fa3 plan: %s\n", label, choice.error.c_str());
      ++failures;
      continue;
    }
    const std::string name = kernel_name(choice.spec, choice.plan);
    if (!names.insert(name).second)
      continue;

    mlirgen::Stages stages;
    Status s = mlirgen::generate(choice.spec, choice.plan, {}, &stages);
    if (!s) {
      std::printf("%s: MLIR: %s\n", name.c_str(), s.message.c_str());
      ++failures;
      continue;
    }
    CompiledKernel mlir;
    mlir.name = name;
    mlir.entry = choice.plan.entry;
    mlir.backend = mlirgen::version_string();
    mlir.ptx = stages.ptx;
    const auto start = std::chrono::steady_clock::now();
    mlir.log = assemble(ptxas, work, name, stages.ptx, &mlir.cubin);
    const double ptxas_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    mlir.resources = parse_ptxas_report(mlir.log, mlir.entry);
    if (mlir.cubin.empty() || mlir.log.find("Potential Performance Loss") != std::string::npos ||
        mlir.resources.spill_store_bytes > 0) {
      std::printf("%s: ptxas:\n%s\n", name.c_str(), mlir.log.c_str());
      ++failures;
      if (mlir.cubin.empty())
        continue;
    }

    CompiledKernel nvrtc;
    s = build_kernel(choice.spec, choice.plan, FLASHJIT_BACKEND_NVRTC, &nvrtc);
    if (!s) {
      std::printf("%s: NVRTC: %s\n", name.c_str(), s.message.c_str());
      ++failures;
      continue;
    }
    constexpr double kMs = 1000.0;
    std::printf("%-46s | %5.0f %5.0f %5.0f %5.0f (%5.0f)  | %3d %4d  | %7.0f  | %3d %4d\n", name.c_str(),
                stages.build_seconds * kMs, stages.lower_seconds * kMs, stages.ptx_seconds * kMs, ptxas_seconds * kMs,
                (stages.build_seconds + stages.lower_seconds + stages.ptx_seconds + ptxas_seconds) * kMs,
                mlir.resources.registers, mlir.resources.spill_store_bytes, nvrtc.compile_seconds * kMs,
                nvrtc.resources.registers, nvrtc.resources.spill_store_bytes);
    mlir_bundle.add(bundle_kernel_from(choice, cache_key(choice.spec, choice.plan, FLASHJIT_BACKEND_MLIR), mlir),
                    mlir.cubin);
    nvrtc_bundle.add(bundle_kernel_from(choice, cache_key(choice.spec, choice.plan, FLASHJIT_BACKEND_NVRTC), nvrtc),
                     nvrtc.cubin);
  }
  for (auto [contents, file] : {std::pair{&mlir_bundle, "fa3-mlir.fjb"}, std::pair{&nvrtc_bundle, "fa3-nvrtc.fjb"}})
    if (Status s = write_bundle_file(out_dir / file, *contents); !s) {
      std::printf("writing %s: %s\n", file, s.message.c_str());
      ++failures;
    }
  std::printf("%zu kernels per bundle in %s, %d failures\n", mlir_bundle.cubins.size(), out_dir.c_str(), failures);
  return failures ? 1 : 0;
}
