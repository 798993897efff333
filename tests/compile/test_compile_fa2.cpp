// Every fa2 specialization compiles for every arch it serves, with no spills (no GPU needed).
#include "compiler/plans/fa2_plan.hpp"
#include "tests/compile/compile_matrix.hpp"

namespace flashjit {
namespace {

struct Fa2Case {
  Arch arch;
  int dqk, dv;
  flashjit_dtype dtype;
  bool causal;
};

void PrintTo(const Fa2Case &c, std::ostream *out) {
  *out << c.arch.name() << " d" << c.dqk << "v" << c.dv;
}

// Issue 2's matrix: every head dim 8..256 (step 8) x fp16/bf16 x causal/full for sm_80 and sm_90a;
// sm_86/sm_89 (99 KB of shared memory: other tiles) and head_dim_v != head_dim_qk on a sample.
std::vector<Fa2Case> fa2_cases() {
  constexpr int kHeadDimStep = 8, kMaxHeadDim = 256;
  std::vector<Fa2Case> cases;
  for (Arch arch : {Arch{80, false}, Arch{90, true}})
    for (int d = kHeadDimStep; d <= kMaxHeadDim; d += kHeadDimStep)
      for (flashjit_dtype dtype : {FLASHJIT_BF16, FLASHJIT_FP16})
        for (bool causal : {false, true})
          cases.push_back({arch, d, d, dtype, causal});
  const std::pair<int, int> sample[] = {{8, 8}, {64, 64}, {72, 72}, {128, 128}, {192, 128}, {256, 256}};
  for (Arch arch : {Arch{86, false}, Arch{89, false}})
    for (auto [dqk, dv] : sample)
      for (flashjit_dtype dtype : {FLASHJIT_BF16, FLASHJIT_FP16})
        cases.push_back({arch, dqk, dv, dtype, dqk % 16 == 0});
  for (Arch arch : {Arch{80, false}, Arch{90, true}})
    cases.push_back({arch, 192, 128, FLASHJIT_BF16, true});
  return cases;
}

class Fa2Compile : public ::testing::TestWithParam<Fa2Case> {};

TEST_P(Fa2Compile, CompilesWithoutSpills) {
  const Fa2Case &c = GetParam();
  KernelSpec spec = testing::prefill_spec(c.arch, c.dqk, c.dv, c.dtype, c.causal);
  CompiledKernel kernel = testing::compile_or_fail(spec, Variant::fa2);
  ASSERT_FALSE(kernel.cubin.empty());
  EXPECT_EQ(kernel.resources.spill_store_bytes, 0) << kernel.name << "\n" << kernel.log;
  EXPECT_EQ(kernel.resources.spill_load_bytes, 0) << kernel.name;
  EXPECT_GT(kernel.resources.registers, 0) << "no ptxas report in the log:\n" << kernel.log;
  EXPECT_NE(kernel.ptx.find("mma.sync.aligned.m16n8k16"), std::string::npos) << kernel.name;
  EXPECT_NE(kernel.ptx.find("ldmatrix"), std::string::npos) << kernel.name;
  EXPECT_NE(kernel.ptx.find("cp.async"), std::string::npos) << kernel.name;
}

INSTANTIATE_TEST_SUITE_P(AllArchsAndHeadDims, Fa2Compile, ::testing::ValuesIn(fa2_cases()),
                         [](const ::testing::TestParamInfo<Fa2Case> &info) {
                           const Fa2Case &c = info.param;
                           return c.arch.name() + "_d" + std::to_string(c.dqk) + "v" + std::to_string(c.dv) + "_" +
                                  (c.dtype == FLASHJIT_FP16 ? "fp16" : "bf16") + (c.causal ? "_causal" : "");
                         });

// load_tile's thread-strided loops (two copies an iteration, at the Q, prologue and ring load
// sites) gave 15 cp.async in the PTX of these paged kernels; the unrolled stream gives one a pass at
// every site, for 32- and 64-bit strides: 35-67 (session 30).
constexpr size_t kMinUnrolledCopies = 30;

// Window + softcap + varlen, or paged (page 1, 16 and 7, the last element-aligned), at head dims on
// both sides of the planner's switch to 16 rows per warp for such specs (d120).
TEST(Fa2CompileFeatures, WindowSoftcapVarlenPagedAndUnalignedCompile) {
  for (Arch arch : {Arch{90, true}, Arch{80, false}})
    for (int dim : {80, 112, 128})
      for (int page : {0, 1, 16, 7}) {
        KernelSpec spec = testing::prefill_spec(arch, dim, dim, FLASHJIT_BF16, true);
        spec.local = spec.softcap = true;
        spec.varlen = page == 0;
        spec.page_size = page;
        spec.align_bytes = page == 7 ? 2 : 16;
        CompiledKernel kernel = testing::compile_or_fail(spec, Variant::fa2);
        EXPECT_EQ(kernel.resources.spill_store_bytes, 0) << kernel.name;
        // 16-byte aligned pages stream through the fixed per-thread pattern: each row's page from the
        // table by ld.global.nc, its address one mad.wide (32-bit byte strides; a 64-bit form for
        // the rest), every pass unrolled (more copies in the PTX than load_tile's loops have).
        if (page != 0 && spec.align_bytes == 16) {
          EXPECT_NE(kernel.ptx.find("mad.wide.s32"), std::string::npos) << kernel.name;
          EXPECT_NE(kernel.ptx.find("ld.global.nc.s32"), std::string::npos) << kernel.name;
          EXPECT_GT(testing::count_of(kernel.ptx, "cp.async.cg.shared.global"), kMinUnrolledCopies) << kernel.name;
        }
      }
}

// A key block run as several QK -> softmax -> PV steps (Fa2Tuning::sub_block_n; the planner uses
// one): the template's step loop compiles, and within the register budget it spills nothing.
TEST(Fa2CompileFeatures, SubBlockStepsCompile) {
  for (bool causal : {false, true}) {
    KernelSpec spec = testing::prefill_spec(Arch{90, true}, 64, 64, FLASHJIT_BF16, causal);
    Fa2Tuning tuning;
    tuning.block_n = 128;
    tuning.sub_block_n = 64;
    Plan plan;
    std::string why;
    ASSERT_TRUE(plan_fa2_tuned(spec, tuning, &plan, &why)) << why;
    ASSERT_EQ(plan.constant("kSubBlockN"), 64);
    CompiledKernel kernel;
    Status s = build_kernel(spec, plan, FLASHJIT_BACKEND_NVRTC, &kernel);
    ASSERT_TRUE(s.ok()) << s.message;
    EXPECT_NE(kernel.name.find("n128s2k64"), std::string::npos) << kernel.name;
    EXPECT_EQ(kernel.resources.spill_store_bytes, 0) << kernel.name << "\n" << kernel.log;
  }
}

TEST(CompileErrors, NameTheKernelAndCarryTheLog) {
  KernelSpec spec = testing::prefill_spec(Arch{80, false}, 64, 64, FLASHJIT_BF16, false);
  PlanChoice choice = choose_plan(spec, Variant::fa2);
  ASSERT_TRUE(choice.ok);
  choice.plan.add("kNotAnIdentifier-", 1); // renders invalid C++
  CompiledKernel kernel;
  Status s = build_kernel(choice.spec, choice.plan, FLASHJIT_BACKEND_NVRTC, &kernel);
  EXPECT_EQ(s.code, FLASHJIT_COMPILE_ERROR);
  EXPECT_NE(s.message.find("prefill.fa2.sm80.d64v64.bf16.full"), std::string::npos) << s.message;
  EXPECT_NE(s.message.find("error"), std::string::npos) << s.message;
}

} // namespace
} // namespace flashjit
