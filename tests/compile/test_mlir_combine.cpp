// The MLIR backend (compiler/mlir/): the combine kernel through every stage (built IR, lowered
// LLVM+NVVM, PTX, cubin), string checks per stage in the manner of FileCheck, ptxas (inside
// nvJitLink) accepting every specialization with zero spills, and bad targets answered with an
// error status while the process lives on. No GPU needed.
#include "compiler/build.hpp"
#include "compiler/planner.hpp"

#ifdef FLASHJIT_WITH_MLIR
#include "compiler/mlir/mlir_backend.hpp"
#include "compiler/mlir/ptxas_tool.hpp"
#endif

#include "tests/compile/file_check.hpp"

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

namespace flashjit {
namespace {

#ifndef FLASHJIT_WITH_MLIR
TEST(MlirBackend, NotInThisBuild) {
  KernelSpec spec;
  spec.op = Op::combine;
  Plan plan;
  std::string why;
  ASSERT_TRUE(plan_combine(spec, &plan, &why)) << why;
  CompiledKernel kernel;
  Status s = build_kernel(spec, plan, FLASHJIT_BACKEND_MLIR, &kernel);
  EXPECT_EQ(s.code, FLASHJIT_UNSUPPORTED);
  GTEST_SKIP() << "built without FLASHJIT_WITH_MLIR (no LLVM/MLIR 22)";
}
#else

using testing::check_in_order;
using testing::check_not;

KernelSpec combine_spec(Arch arch, int dv, flashjit_dtype dtype, int align_bytes = 16) {
  KernelSpec spec;
  spec.op = Op::combine;
  spec.arch = arch;
  spec.head_dim_qk = dv;
  spec.head_dim_v = dv;
  spec.dtype = dtype;
  spec.align_bytes = align_bytes;
  return spec;
}

Plan combine_plan(const KernelSpec &spec) {
  Plan plan;
  std::string why;
  EXPECT_TRUE(plan_combine(spec, &plan, &why)) << why;
  return plan;
}

const Arch kSm90a{90, true};
const Arch kSm80{80, false};

// --- one test per generator stage -------------------------------------------------------------

TEST(MlirCombineStages, BuiltIr) {
  KernelSpec spec = combine_spec(kSm90a, 128, FLASHJIT_BF16);
  mlirgen::Stages stages;
  Status s = mlirgen::generate(spec, combine_plan(spec), {}, &stages);
  ASSERT_TRUE(s.ok()) << s.message;
  EXPECT_TRUE(check_in_order(stages.built,
                             {
                                 "gpu.container_module",
                                 "gpu.module @flashjit [#nvvm.target<O = 3, chip = \"sm_90a\", features = \"+ptx80\">]",
                                 "gpu.func @fj_combine(%arg0: !llvm.ptr) kernel",
                                 "known_block_size = array<i32: 128, 1, 1>",
                                 "llvm.getelementptr", // fields of the parameter block
                                 "nvvm.read.ptx.sreg.ctaid.x",
                                 "scf.for", // rows, grid-stride
                                 "scf.for", // max LSE over states
                                 "llvm.load",
                                 "invariant",
                                 "llvm.intr.maxnum",
                                 "nvvm.shfl.sync  bfly",
                                 "scf.if", // empty row: no sum
                                 "llvm.nvvm.ex2.approx.ftz.f32",
                                 "nvvm.rcp.approx.ftz.f",
                                 "vector<4xf32>", // batched v4 loads
                                 "arith.truncf",
                                 "vector<2xbf16>",
                                 "llvm.store",
                                 "llvm.nvvm.lg2.approx.ftz.f",
                                 "gpu.return",
                             }));
}

TEST(MlirCombineStages, LoweredIr) {
  KernelSpec spec = combine_spec(kSm90a, 128, FLASHJIT_BF16);
  mlirgen::Stages stages;
  Status s = mlirgen::generate(spec, combine_plan(spec), {}, &stages);
  ASSERT_TRUE(s.ok()) << s.message;
  EXPECT_TRUE(check_in_order(
      stages.lowered,
      {"llvm.func @fj_combine(%arg0: !llvm.ptr {llvm.align = 8 : i64, llvm.byval = !llvm.struct<(ptr, ptr, i64, i64, "
       "ptr, i64, ptr, i32, i32, i32, i32)>, nvvm.grid_constant})",
       "nvvm.kernel", "nvvm.maxntid = array<i32: 128, 1, 1>", "llvm.cond_br", "nvvm.shfl.sync", "llvm.return"}));
  EXPECT_TRUE(check_not(stages.lowered, {"scf.", "arith.", "gpu.func", "vector.", "unrealized_conversion_cast"}));
}

TEST(MlirCombineStages, Ptx) {
  KernelSpec spec = combine_spec(kSm90a, 128, FLASHJIT_BF16);
  mlirgen::Stages stages;
  Status s = mlirgen::generate(spec, combine_plan(spec), {}, &stages);
  ASSERT_TRUE(s.ok()) << s.message;
  EXPECT_TRUE(check_in_order(stages.ptx,
                             {".version 8.0", ".target sm_90a", ".address_size 64", ".visible .entry fj_combine(",
                              ".param .align 8 .b8 fj_combine_param_0[72]", ".maxntid 128, 1, 1", "ld.param",
                              "shfl.sync.bfly.b32", "ex2.approx.ftz.f32", "rcp.approx.ftz.f32", "ld.global.nc.b32",
                              "ld.global.nc.v4.b32", "cvt.rn.bf16x2.f32", "st.global.v2.b32", "lg2.approx.ftz.f32"}));
  // `contract` on the float ops lets multiplies fuse into adds, as NVRTC's --fmad=true does.
  EXPECT_TRUE(check_in_order(stages.ptx, {"fma.rn.f32"}));
  // By value through grid_constant: no copy of the block to local memory.
  EXPECT_TRUE(check_not(stages.ptx, {".local", "__nv_"}));
}

TEST(MlirCombineStages, Fp16UnalignedPtx) {
  KernelSpec spec = combine_spec(kSm80, 72, FLASHJIT_FP16, /*align_bytes=*/2);
  mlirgen::Stages stages;
  Status s = mlirgen::generate(spec, combine_plan(spec), {}, &stages);
  ASSERT_TRUE(s.ok()) << s.message;
  // Element-aligned rows: 2-byte stores only (LLVM may convert pairs with cvt.rn.f16x2 first).
  EXPECT_TRUE(check_in_order(stages.ptx, {".version 7.0", ".target sm_80", "cvt.rn.f16", "st.global.b16"}));
  EXPECT_TRUE(check_not(stages.ptx, {"st.global.v2.b32"}));
}

// --- ptxas (through nvJitLink) accepts every specialization, zero spills ------------------------

struct CombineCase {
  Arch arch;
  int dv;
  flashjit_dtype dtype;
  int align_bytes;
};

void PrintTo(const CombineCase &c, std::ostream *out) {
  *out << c.arch.name() << " dv" << c.dv << (c.dtype == FLASHJIT_FP16 ? " fp16" : " bf16") << " al" << c.align_bytes;
}

std::vector<CombineCase> combine_cases() {
  std::vector<CombineCase> cases;
  for (Arch arch : {Arch{80, false}, Arch{86, false}, Arch{89, false}, Arch{90, true}})
    for (int dv : {8, 64, 72, 128, 200, 256})
      for (flashjit_dtype dtype : {FLASHJIT_BF16, FLASHJIT_FP16})
        for (int align : {16, 2})
          cases.push_back({arch, dv, dtype, align});
  return cases;
}

class MlirCombineCompile : public ::testing::TestWithParam<CombineCase> {};

TEST_P(MlirCombineCompile, PtxasAcceptsWithoutSpills) {
  const CombineCase &c = GetParam();
  KernelSpec spec = combine_spec(c.arch, c.dv, c.dtype, c.align_bytes);
  CompiledKernel kernel;
  Status s = build_kernel(spec, combine_plan(spec), FLASHJIT_BACKEND_MLIR, &kernel);
  if (!s.ok() && s.message.find("nvJitLink is not available") != std::string::npos)
    GTEST_SKIP() << s.message;
  ASSERT_TRUE(s.ok()) << s.message;
  EXPECT_EQ(kernel.entry, "fj_combine");
  EXPECT_EQ(kernel.backend, mlirgen::version_string());
  ASSERT_FALSE(kernel.cubin.empty());
  EXPECT_GT(kernel.resources.registers, 0) << "no ptxas report in the log:\n" << kernel.log;
  EXPECT_EQ(kernel.resources.spill_store_bytes, 0) << kernel.name << "\n" << kernel.log;
  EXPECT_EQ(kernel.resources.spill_load_bytes, 0) << kernel.name;
  EXPECT_TRUE(kernel.resources.warnings.empty()) << kernel.log;
}

INSTANTIATE_TEST_SUITE_P(AllCombine, MlirCombineCompile, ::testing::ValuesIn(combine_cases()));

// --- selection, cache key ----------------------------------------------------------------------

TEST(MlirBackend, CoversEveryVariant) {
  for (Variant variant : {Variant::combine, Variant::decode_splitk, Variant::fa2, Variant::fa3})
    EXPECT_TRUE(mlirgen::covers(variant)) << variant_name(variant);
}

// The backend string (explain, logs, cache key) names LLVM and the assembler: whole-program ptxas
// where the toolkit has one, else nvJitLink's relocatable assembly, said so.
TEST(MlirBackend, BackendNamesLlvmAndTheAssembler) {
  KernelSpec spec = combine_spec(kSm90a, 128, FLASHJIT_BF16);
  CompiledKernel kernel;
  Status s = build_kernel(spec, combine_plan(spec), FLASHJIT_BACKEND_MLIR, &kernel);
  ASSERT_TRUE(s.ok()) << s.message;
  EXPECT_EQ(kernel.backend.rfind(std::string("mlir ") + FLASHJIT_LLVM_VERSION, 0), 0u) << kernel.backend;
  if (ptxas::path().empty())
    EXPECT_NE(kernel.backend.find("relocatable"), std::string::npos) << kernel.backend;
  else
    EXPECT_NE(kernel.backend.find("+ ptxas "), std::string::npos) << kernel.backend;
  EXPECT_GT(kernel.resources.registers, 0) << kernel.log;
}

TEST(MlirBackend, CacheKeyNamesTheBackend) {
  KernelSpec spec = combine_spec(kSm90a, 128, FLASHJIT_BF16);
  Plan plan = combine_plan(spec);
  EXPECT_NE(cache_key(spec, plan, FLASHJIT_BACKEND_MLIR), cache_key(spec, plan, FLASHJIT_BACKEND_NVRTC));
  EXPECT_EQ(cache_key(spec, plan, FLASHJIT_BACKEND_MLIR), cache_key(spec, plan, FLASHJIT_BACKEND_MLIR));
}

// --- no crash, ever ------------------------------------------------------------------------------

TEST(MlirBackend, BadTargetsAreRejectedBeforeLowering) {
  KernelSpec spec = combine_spec(kSm90a, 128, FLASHJIT_BF16);
  Plan plan = combine_plan(spec);
  const mlirgen::Target bad[] = {
      {"sm_75", "+ptx70"},  // below what every kernel needs
      {"sm_90a", "+ptx60"}, // PTX ISA too old for the chip
      {"sm_999", "+ptx80"}, // a chip LLVM does not know
      {"sm_80", "+ptx999"}, // a PTX ISA LLVM does not know
      {"gfx90a", "+ptx80"}, // not NVPTX at all
      {"sm_90a", "+ptx80,+foo"},
  };
  for (const mlirgen::Target &target : bad) {
    mlirgen::Options options;
    options.target = target;
    options.use_target = true;
    mlirgen::Stages stages;
    Status s = mlirgen::generate(spec, plan, options, &stages);
    EXPECT_EQ(s.code, FLASHJIT_UNSUPPORTED) << target.chip << " " << target.features << ": " << s.message;
    EXPECT_TRUE(stages.ptx.empty());
  }
  mlirgen::Target fa3_on_ampere{"sm_80", "+ptx70"};
  EXPECT_FALSE(mlirgen::validate_target(fa3_on_ampere, Variant::fa3).ok());
  EXPECT_TRUE(mlirgen::validate_target(mlirgen::target_for(kSm90a), Variant::fa3).ok());
}

// A TMA load into shared::cta needs PTX ISA 8.6; with +ptx80 the NVPTX backend cannot select the
// intrinsic and calls report_fatal_error, which would abort the process. Validation is skipped so
// that the guard is what catches it.
constexpr const char *kNeedsPtx86 = R"(
module attributes {gpu.container_module} {
  gpu.module @kern [#nvvm.target<chip = "sm_90a", features = "+ptx80", O = 3>] {
    llvm.mlir.global internal @smem_a() {addr_space = 3 : i32, alignment = 1024 : i64} : !llvm.array<8192 x i8>
    llvm.mlir.global internal @mbar() {addr_space = 3 : i32, alignment = 8 : i64} : i64
    llvm.func @k(%desc: !llvm.ptr) attributes {nvvm.kernel} {
      %c0 = llvm.mlir.constant(0 : i32) : i32
      %smem = llvm.mlir.addressof @smem_a : !llvm.ptr<3>
      %bar = llvm.mlir.addressof @mbar : !llvm.ptr<3>
      nvvm.cp.async.bulk.tensor.shared.cluster.global %smem, %desc, %bar, box[%c0, %c0] {isCTAOnly = true} : !llvm.ptr<3>, !llvm.ptr
      llvm.return
    }
  }
}
)";

// The deliberate fatal error disables the MLIR backend for the rest of its process, so it runs in a
// child process (a gtest death test), which must exit normally: the process lives on.
void fatal_error_scenario() {
  mlirgen::Options options;
  options.skip_validation = true;
  mlirgen::Stages stages;
  Status s = mlirgen::lower_text(kNeedsPtx86, {"sm_90a", "+ptx80"}, options, &stages);
  EXPECT_EQ(s.code, FLASHJIT_COMPILE_ERROR) << s.message;
  EXPECT_NE(s.message.find("fatal error"), std::string::npos) << s.message;
  EXPECT_TRUE(stages.ptx.empty());

  // Still alive. LLVM's process-wide state is not trusted after a fatal error, so the MLIR backend
  // refuses further work with a clear status, and NVRTC builds the same kernel.
  KernelSpec spec = combine_spec(kSm90a, 64, FLASHJIT_FP16);
  s = mlirgen::generate(spec, combine_plan(spec), {}, &stages);
  EXPECT_EQ(s.code, FLASHJIT_COMPILE_ERROR);
  EXPECT_NE(s.message.find("disabled in this process"), std::string::npos) << s.message;
  CompiledKernel nvrtc;
  s = build_kernel(spec, combine_plan(spec), FLASHJIT_BACKEND_NVRTC, &nvrtc);
  EXPECT_TRUE(s.ok()) << s.message;
  EXPECT_FALSE(nvrtc.cubin.empty());
  std::exit(::testing::Test::HasFailure() ? 1 : 0);
}

TEST(MlirBackend, LlvmFatalErrorBecomesAStatus) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(fatal_error_scenario(), ::testing::ExitedWithCode(0), "");
}

#endif

} // namespace
} // namespace flashjit
