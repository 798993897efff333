// The MLIR backend's fa3 prefill kernel for sm_90a (compiler/mlir/gen_fa3.cpp): string checks per
// stage in the manner of FileCheck, the NVRTC parameter block (fj_fa3_params, 896 bytes, 64-byte
// aligned so the tensor maps are), ptxas accepting every covered specialization with zero spills and
// no wgmma serialization, the Hopper instructions in the PTX, registers next to NVRTC's build of the
// same plan, and FLASHJIT_UNSUPPORTED with a reason for what the generator does not cover. No GPU.
//
// ptxas runs in whole-program mode here (the toolkit's ptxas on the PTX), as NVRTC compiles: the
// backend's nvJitLink step compiles PTX as a relocatable unit, where ptxas ignores setmaxnreg
// (C7504) and fa3 spills, for NVRTC's PTX as much as for ours.
#include "compiler/build.hpp"
#include "compiler/compiled_kernel.hpp"
#include "compiler/planner.hpp"
#include "compiler/plans/fa3_plan.hpp"

#ifdef FLASHJIT_WITH_MLIR
#include "compiler/mlir/mlir_backend.hpp"
#include "compiler/mlir/ptxas_tool.hpp"
#endif

#include "params_fa3.h"

#include "tests/compile/file_check.hpp"

#include <gtest/gtest.h>

#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

namespace flashjit {
namespace {

const Arch kSm90a{90, true};

KernelSpec fa3_spec(int dqk, int dv, flashjit_dtype dtype, bool causal) {
  KernelSpec spec;
  spec.arch = kSm90a;
  spec.head_dim_qk = dqk;
  spec.head_dim_v = dv;
  spec.dtype = dtype;
  spec.causal = causal;
  return spec;
}

Plan fa3_plan(const KernelSpec &spec) {
  PlanChoice choice = choose_plan(spec, Variant::fa3, FLASHJIT_BACKEND_MLIR);
  EXPECT_TRUE(choice.ok) << choice.error;
  return choice.plan;
}

#ifndef FLASHJIT_WITH_MLIR
TEST(MlirFa3, NotInThisBuild) {
  KernelSpec spec = fa3_spec(128, 128, FLASHJIT_BF16, false);
  CompiledKernel kernel;
  Status s = build_kernel(spec, fa3_plan(spec), FLASHJIT_BACKEND_MLIR, &kernel);
  EXPECT_EQ(s.code, FLASHJIT_UNSUPPORTED);
  GTEST_SKIP() << "built without FLASHJIT_WITH_MLIR (no LLVM/MLIR 22)";
}
#else

using testing::check_in_order;
using testing::check_not;

// LLVM's NVPTX printer separates an instruction's operands from its name with " \t".
const std::string kParamDecl =
    ".param .align 64 .b8 fj_fa3_prefill_param_0[" + std::to_string(sizeof(fj_fa3_params)) + "]";

mlirgen::Stages generate_or_fail(const KernelSpec &spec) {
  mlirgen::Stages stages;
  Status s = mlirgen::generate(spec, fa3_plan(spec), {}, &stages);
  EXPECT_TRUE(s.ok()) << s.message;
  return stages;
}

// d128 bf16 non-causal: 2 consumer warpgroups, kBlockN 160, pingpong, separate O region.
TEST(MlirFa3Stages, BuiltIr) {
  const mlirgen::Stages stages = generate_or_fail(fa3_spec(128, 128, FLASHJIT_BF16, false));
  EXPECT_TRUE(check_in_order(stages.built, {
                                               "gpu.module @flashjit [#nvvm.target<O = 3, chip = \"sm_90a\"",
                                               "llvm.mlir.global external @fj_fa3_smem()",
                                               "addr_space = 3",
                                               "gpu.func @fj_fa3_prefill(%arg0: !llvm.ptr) kernel",
                                               "known_block_size = array<i32: 384, 1, 1>",
                                               "nvvm.shfl.sync  idx", // warp-uniform role
                                               "mbarrier.init.shared::cta.b64",
                                               "nvvm.fence.mbarrier.init",
                                               "prefetch.tensormap",
                                               "nvvm.barrier0",
                                               "nvvm.setmaxregister  decrease 24",
                                               "createpolicy.fractional.L2::evict_last",
                                               "scf.for", // persistent tile loop (producer)
                                               "mbarrier.try_wait.parity",
                                               "cp.async.bulk.tensor.4d.shared::cluster.global.tile",
                                               "nvvm.setmaxregister  increase 240",
                                               "nvvm.barrier.arrive", // pingpong token
                                               "nvvm.wgmma.fence.aligned",
                                               "wgmma.mma_async.sync.aligned.m64n160k16.f32.bf16.bf16",
                                               "nvvm.wgmma.commit.group.sync.aligned",
                                               "nvvm.wgmma.wait.group.sync.aligned 0",
                                               "llvm.nvvm.ex2.approx.ftz.f32",
                                               "scf.for",                                               // KV blocks
                                               "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16", // RS P.V
                                               "nvvm.wgmma.wait.group.sync.aligned 1",
                                               "stmatrix.sync.aligned.m8n8.x4.shared.b16",
                                               "nvvm.fence.proxy",
                                               "cp.async.bulk.tensor.4d.global.shared::cta.tile.bulk_group",
                                               "nvvm.cp.async.bulk.commit.group",
                                               "gpu.return",
                                           }));
}

TEST(MlirFa3Stages, LoweredIr) {
  const mlirgen::Stages stages = generate_or_fail(fa3_spec(128, 128, FLASHJIT_BF16, false));
  EXPECT_TRUE(check_in_order(stages.lowered, {"llvm.func @fj_fa3_prefill(%arg0: !llvm.ptr {",
                                              "llvm.byval = !llvm.struct<(struct<(struct<(ptr, i64, i64, i64)>",
                                              "array<2 x vector<8xi64>>", // 64-byte aligned tensor maps
                                              "nvvm.grid_constant}", "nvvm.kernel",
                                              "nvvm.maxntid = array<i32: 384, 1, 1>", "nvvm.minctasm = 1"}));
  EXPECT_TRUE(check_not(stages.lowered, {"scf.", "arith.", "gpu.func", "vector.", "unrealized_conversion_cast"}));
}

TEST(MlirFa3Stages, Ptx) {
  const mlirgen::Stages stages = generate_or_fail(fa3_spec(128, 128, FLASHJIT_BF16, false));
  EXPECT_TRUE(
      check_in_order(stages.ptx, {".target sm_90a", ".extern .shared .align 16 .b8 fj_fa3_smem[]",
                                  ".visible .entry fj_fa3_prefill(", kParamDecl, ".maxntid 384, 1, 1",
                                  ".minnctapersm 1", "shfl.sync.idx.b32", "mbarrier.init.shared::cta.b64",
                                  "fence.mbarrier_init.release.cluster", "prefetch.tensormap", "bar.sync \t0"}));
  for (const char *op :
       {"setmaxnreg.dec.sync.aligned.u32 \t24",
        "setmaxnreg.inc.sync.aligned.u32 \t240",
        "createpolicy.fractional.L2::evict_last.b64",
        "createpolicy.fractional.L2::evict_first.b64",
        "mbarrier.arrive.expect_tx.shared::cta.b64",
        "mbarrier.try_wait.parity.shared::cta.b64",
        "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.L2::cache_hint",
        "wgmma.fence.sync.aligned",
        "wgmma.mma_async.sync.aligned.m64n160k16.f32.bf16.bf16",
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16",
        "wgmma.commit_group.sync.aligned",
        "wgmma.wait_group.sync.aligned \t1",
        "bar.arrive",
        "mbarrier.arrive.shared::cta.b64",
        "ex2.approx.ftz.f32",
        "shfl.sync.bfly.b32",
        "cvt.rn.bf16x2.f32",
        "rcp.approx.ftz.f32",
        "lg2.approx.ftz.f32",
        "stmatrix.sync.aligned.m8n8.x4.shared.b16",
        "fence.proxy.async.shared::cta",
        "cp.async.bulk.tensor.4d.global.shared::cta.tile.bulk_group",
        "cp.async.bulk.commit_group",
        "cp.async.bulk.wait_group.read \t0",
        "cp.async.bulk.wait_group \t0"})
    EXPECT_NE(stages.ptx.find(op), std::string::npos) << op;
  EXPECT_TRUE(check_not(stages.ptx, {".local", "__nv_"}));
}

// fp16, d72 (an odd number of 8-column groups: stmatrix x2), causal, 3 consumer warpgroups.
TEST(MlirFa3Stages, PtxFp16Dim72Causal) {
  const mlirgen::Stages stages = generate_or_fail(fa3_spec(72, 72, FLASHJIT_FP16, true));
  EXPECT_TRUE(check_in_order(stages.ptx, {".maxntid 512, 1, 1", "setmaxnreg.dec.sync.aligned.u32 \t32"}));
  for (const char *op : {"setmaxnreg.inc.sync.aligned.u32 \t160", "wgmma.mma_async.sync.aligned.m64n112k16.f32.f16.f16",
                         "wgmma.mma_async.sync.aligned.m64n72k16.f32.f16.f16", "cvt.rn.f16x2.f32",
                         "stmatrix.sync.aligned.m8n8.x2.shared.b16"})
    EXPECT_NE(stages.ptx.find(op), std::string::npos) << op;
}

// --- ptxas accepts every covered specialization: no spills, no serialization --------------------

// Whole-program ptxas -v on `ptx` (the backend's own assembler, compiler/mlir/ptxas_tool.hpp);
// returns its log, with a line saying so when ptxas failed.
std::string run_ptxas(const std::string &ptx, const std::string &tag) {
  std::vector<char> cubin;
  std::string log;
  if (Status s = ptxas::assemble(ptx, "sm_90a", tag, &cubin, &log); !s)
    log += "\nptxas exited with an error";
  return log;
}

struct Fa3Case {
  int dqk, dv;
  flashjit_dtype dtype;
  bool causal;
};

std::string case_name(const Fa3Case &c) {
  return "d" + std::to_string(c.dqk) + "v" + std::to_string(c.dv) + "_" + (c.dtype == FLASHJIT_FP16 ? "fp16" : "bf16") +
         (c.causal ? "_causal" : "");
}

std::vector<Fa3Case> fa3_cases() {
  std::vector<Fa3Case> cases;
  for (auto [dqk, dv] : {std::pair{64, 64}, std::pair{72, 72}, std::pair{80, 80}, std::pair{128, 128},
                         std::pair{256, 256}, std::pair{192, 128}})
    for (flashjit_dtype dtype : {FLASHJIT_BF16, FLASHJIT_FP16})
      for (bool causal : {false, true})
        cases.push_back({dqk, dv, dtype, causal});
  return cases;
}

class MlirFa3Compile : public ::testing::TestWithParam<Fa3Case> {};

TEST_P(MlirFa3Compile, PtxasAcceptsWithoutSpillsOrSerialization) {
  const Fa3Case &c = GetParam();
  if (ptxas::path().empty())
    GTEST_SKIP() << "no ptxas (CUDA toolkit) on this machine";
  const KernelSpec spec = fa3_spec(c.dqk, c.dv, c.dtype, c.causal);
  const mlirgen::Stages stages = generate_or_fail(spec);
  for (const char *instruction : {"wgmma.mma_async", "cp.async.bulk.tensor", "setmaxnreg"})
    EXPECT_NE(stages.ptx.find(instruction), std::string::npos) << instruction;
  EXPECT_NE(stages.ptx.find(kParamDecl), std::string::npos);
  const std::string log = run_ptxas(stages.ptx, case_name(c));
  const ResourceUsage usage = parse_ptxas_report(log, "fj_fa3_prefill");
  EXPECT_GT(usage.registers, 0) << log;
  EXPECT_EQ(usage.spill_store_bytes, 0) << log;
  EXPECT_EQ(usage.spill_load_bytes, 0) << log;
  EXPECT_EQ(usage.stack_frame_bytes, 0) << log;
  EXPECT_TRUE(usage.warnings.empty()) << log;
  // (C7504) setmaxnreg ignored, (C7508) no register count at entry, (C7510..C7520) wgmma serialized.
  EXPECT_EQ(log.find("Potential Performance Loss"), std::string::npos) << log;
  EXPECT_EQ(log.find("error"), std::string::npos) << log;
}

INSTANTIATE_TEST_SUITE_P(Covered, MlirFa3Compile, ::testing::ValuesIn(fa3_cases()),
                         [](const ::testing::TestParamInfo<Fa3Case> &info) { return case_name(info.param); });

// Registers and spills next to NVRTC's build of the same plan (both whole-program ptxas). With
// __launch_bounds__(threads, 1) both report the entry's cap (65536 / threads, rounded down to 8); the
// consumer's setmaxnreg budget is a plan constant. Prints the table the report quotes.
TEST(MlirFa3, RegistersNextToNvrtc) {
  if (ptxas::path().empty())
    GTEST_SKIP() << "no ptxas (CUDA toolkit) on this machine";
  std::ostringstream table;
  table << "spec                 mlir regs/spill   nvrtc regs/spill\n";
  for (const Fa3Case &c : {Fa3Case{64, 64, FLASHJIT_BF16, false}, Fa3Case{80, 80, FLASHJIT_FP16, true},
                           Fa3Case{128, 128, FLASHJIT_BF16, true}, Fa3Case{256, 256, FLASHJIT_BF16, false},
                           Fa3Case{192, 128, FLASHJIT_FP16, false}}) {
    const KernelSpec spec = fa3_spec(c.dqk, c.dv, c.dtype, c.causal);
    const mlirgen::Stages stages = generate_or_fail(spec);
    const ResourceUsage mlir = parse_ptxas_report(run_ptxas(stages.ptx, "regs_" + case_name(c)));
    CompiledKernel nvrtc;
    Status s = build_kernel(spec, fa3_plan(spec), FLASHJIT_BACKEND_NVRTC, &nvrtc);
    ASSERT_TRUE(s.ok()) << s.message;
    EXPECT_LE(mlir.registers, nvrtc.resources.registers) << case_name(c);
    EXPECT_EQ(mlir.spill_store_bytes, 0) << case_name(c);
    char line[160];
    std::snprintf(line, sizeof(line), "%-20s %4d / %-4d         %4d / %d\n", case_name(c).c_str(), mlir.registers,
                  mlir.spill_store_bytes, nvrtc.resources.registers, nvrtc.resources.spill_store_bytes);
    table << line;
  }
  std::printf("%s", table.str().c_str());
}

// The backend's own PTX -> cubin step (nvJitLink) links the kernel under the NVRTC entry name.
TEST(MlirFa3, BuildKernelMakesACubin) {
  const KernelSpec spec = fa3_spec(80, 80, FLASHJIT_BF16, true);
  CompiledKernel kernel;
  Status s = build_kernel(spec, fa3_plan(spec), FLASHJIT_BACKEND_MLIR, &kernel);
  if (!s.ok() && s.message.find("nvJitLink is not available") != std::string::npos)
    GTEST_SKIP() << s.message;
  ASSERT_TRUE(s.ok()) << s.message;
  EXPECT_EQ(kernel.entry, "fj_fa3_prefill");
  EXPECT_FALSE(kernel.cubin.empty());
  EXPECT_NE(kernel.backend.find("mlir"), std::string::npos) << kernel.backend;
}

// Sliding window, softcap and varlen build and assemble like the rest.
TEST(MlirFa3, WindowSoftcapVarlen) {
  if (ptxas::path().empty())
    GTEST_SKIP() << "no ptxas (CUDA toolkit) on this machine";
  KernelSpec spec = fa3_spec(128, 128, FLASHJIT_BF16, false);
  spec.local = true;
  spec.softcap = true;
  spec.varlen = true;
  const mlirgen::Stages stages = generate_or_fail(spec);
  // varlen: rows past the sequence go out through predicated 16-byte stores; softcap: tanh via ex2 + rcp
  for (const char *op : {"ld.shared.v4.b32", "st.global.v4.b32", "ld.global.nc.b32", "div.rn.f32"})
    EXPECT_NE(stages.ptx.find(op), std::string::npos) << op;
  const std::string log = run_ptxas(stages.ptx, "window_softcap_varlen");
  const ResourceUsage usage = parse_ptxas_report(log, "fj_fa3_prefill");
  EXPECT_EQ(usage.spill_store_bytes, 0) << log;
  EXPECT_TRUE(usage.warnings.empty()) << log;
  EXPECT_EQ(log.find("Potential Performance Loss"), std::string::npos) << log;
}

// The unmasked key loop (kUnmaskedKeyLoop, the MLIR plans' default without masking since run 26b):
// the element mask, a select per score, is generated for the tile's last block only, and ptxas
// accepts the kernel as it accepts the masked one (unmasked_key_loop=0).
TEST(MlirFa3, UnmaskedKeyLoopComparesOnlyInThePrologue) {
  if (ptxas::path().empty())
    GTEST_SKIP() << "no ptxas (CUDA toolkit) on this machine";
  const KernelSpec spec = fa3_spec(128, 128, FLASHJIT_BF16, false);
  const Plan unmasked_plan = fa3_plan(spec);
  ASSERT_EQ(unmasked_plan.constant("kUnmaskedKeyLoop"), 1);
  Fa3Tuning tuning;
  tuning.unmasked_key_loop = 0;
  Plan masked_plan;
  std::string why;
  ASSERT_TRUE(plan_fa3_tuned(spec, tuning, &masked_plan, &why, FLASHJIT_BACKEND_MLIR)) << why;
  ASSERT_EQ(masked_plan.constant("kUnmaskedKeyLoop"), 0);
  mlirgen::Stages masked, unmasked;
  Status s = mlirgen::generate(spec, masked_plan, {}, &masked);
  ASSERT_TRUE(s.ok()) << s.message;
  s = mlirgen::generate(spec, unmasked_plan, {}, &unmasked);
  ASSERT_TRUE(s.ok()) << s.message;
  // LLVM shares comparisons between a thread's two rows and selects per score, so count both.
  const auto compares_and_selects = [](const std::string &ptx) {
    size_t count = 0;
    for (const char *op : {"setp.", "selp."})
      for (size_t at = ptx.find(op); at != std::string::npos; at = ptx.find(op, at + 1))
        ++count;
    return count;
  };
  EXPECT_GE(compares_and_selects(masked.ptx),
            compares_and_selects(unmasked.ptx) + static_cast<size_t>(unmasked_plan.block_n / 2))
      << "the loop's copy of the mask should be gone";
  const std::string log = run_ptxas(unmasked.ptx, "unmasked_key_loop");
  const ResourceUsage usage = parse_ptxas_report(log, "fj_fa3_prefill");
  EXPECT_EQ(usage.spill_store_bytes, 0) << log;
  EXPECT_TRUE(usage.warnings.empty()) << log;
  EXPECT_EQ(log.find("Potential Performance Loss"), std::string::npos) << log;
}

// --- what is not covered is refused, with the reason ----------------------------------------------

TEST(MlirFa3, UncoveredSpecsAreUnsupported) {
  // Paged KV: the fa3 planner refuses it already; the generator names it too (plan of the
  // contiguous spec, handed the paged one).
  KernelSpec contiguous = fa3_spec(128, 128, FLASHJIT_BF16, false);
  KernelSpec paged = contiguous;
  paged.page_size = 16;
  mlirgen::Stages stages;
  Status s = mlirgen::generate(paged, fa3_plan(contiguous), {}, &stages);
  EXPECT_EQ(s.code, FLASHJIT_UNSUPPORTED) << s.message;
  EXPECT_NE(s.message.find("paged KV"), std::string::npos) << s.message;
  // sm_90 without the arch-specific features: no wgmma / setmaxnreg.
  mlirgen::Options options;
  options.use_target = true;
  options.target = {"sm_90", "+ptx80"};
  s = mlirgen::generate(contiguous, fa3_plan(contiguous), options, &stages);
  EXPECT_EQ(s.code, FLASHJIT_UNSUPPORTED) << s.message;
  EXPECT_NE(s.message.find("sm_90a"), std::string::npos) << s.message;
}

#endif

} // namespace
} // namespace flashjit
